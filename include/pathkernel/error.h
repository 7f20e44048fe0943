// Errors: the user-facing exception type and the internal assertion.
//
// Two tiers, as in the house style:
//  - PK_ASSERT(cond): an internal invariant; aborts with file and line.
//  - pathkernel::Error: a user error (bad input, bad option, corrupt file).
//    Its message says what was wrong, the offending value and what was
//    expected. Use PK_CHECK(cond, message-stream) to throw it.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace pathkernel {

/// A user error: bad input, a corrupt file, an unknown name, an out-of-range
/// option. The message is complete and meant to be shown to the user as is.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

[[noreturn]] void assertion_failed(const char* expr, const char* file, int line);

/// Multiplies sizes, throwing Error on overflow (steps x parameters x samples
/// overflows easily). `what` names the quantity in the message.
int64_t mul_no_overflow(int64_t a, int64_t b, const char* what);

}  // namespace pathkernel

#define PK_ASSERT(cond)                                                   \
  do {                                                                    \
    if (!(cond)) ::pathkernel::assertion_failed(#cond, __FILE__, __LINE__); \
  } while (0)

/// Throws pathkernel::Error with a streamed message when `cond` is false:
///   PK_CHECK(lr > 0, "learning rate must be > 0 (got " << lr << ")");
#define PK_CHECK(cond, msg)                   \
  do {                                        \
    if (!(cond)) {                            \
      std::ostringstream pk_check_stream_;    \
      pk_check_stream_ << msg;                \
      throw ::pathkernel::Error(pk_check_stream_.str()); \
    }                                         \
  } while (0)

/// Throws pathkernel::Error unconditionally with a streamed message.
#define PK_THROW(msg)                         \
  do {                                        \
    std::ostringstream pk_check_stream_;      \
    pk_check_stream_ << msg;                  \
    throw ::pathkernel::Error(pk_check_stream_.str()); \
  } while (0)
