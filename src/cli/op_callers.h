// Which of the program's own functions called a LibTorch operation, for the
// operation profile (op_profile.h): the call stack's first frames inside the
// program's executable once the stack has left it (LibTorch's dispatcher and
// the profile's own callback lie between), named afterwards by addr2line.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace pathkernel::cli {

/// Return addresses in the program's executable, as offsets from where it
/// is loaded (what addr2line takes); 0 where the stack held fewer.
using ProgramCallers = std::array<uintptr_t, 3>;

/// The first frames of the calling thread's stack inside the program's
/// executable, after the first frame outside it: called from within a
/// LibTorch callback, the program's frames that led to the operation,
/// innermost first. A few microseconds a call.
ProgramCallers program_callers();

/// `address`, in the program's executable, as an offset from where it is
/// loaded.
uintptr_t program_offset(const void* address);

/// The function at each offset of the program's executable, demangled
/// ("pathkernel::contract(...)"), by one call of binutils' addr2line; where
/// it cannot name one, the offset in hex ("0x1c2f0").
std::vector<std::string> program_functions(const std::vector<uintptr_t>& offsets);

/// The first of `names` (a caller's frames, innermost first) that is not
/// LibTorch's, c10's or the standard library's inline code compiled into
/// the program: the pathkernel function (or test) that made the call. The
/// last non-empty name when every one is.
std::string calling_function(const std::vector<std::string>& names);

}  // namespace pathkernel::cli
