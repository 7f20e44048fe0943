// The ranks of a job and their collectives (distributed.h): MPI when built
// with it and started by a launcher, one process of rank 0 otherwise.
#include "pathkernel/distributed.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

#ifdef PATHKERNEL_WITH_MPI
#include <mpi.h>
#endif

namespace pathkernel {

namespace {

Communicator* the_world = nullptr;

#ifdef PATHKERNEL_WITH_MPI
bool mpi_started = false;

/// Whether an MPI launcher started this process: mpirun (Open MPI), a PMIx
/// launcher (srun --mpi=pmix, prterun) or a PMI one (MPICH's and Intel's
/// mpiexec, srun --mpi=pmi2). A process started by hand does not start MPI,
/// so it needs no launcher daemon and runs exactly as it always did.
bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

/// Largest message, in bytes, of one MPI call (counts are int).
constexpr int64_t kMaxMessage = int64_t(1) << 30;

void send_bytes(const void* data, int64_t bytes, int to) {
  const char* p = static_cast<const char*>(data);
  for (int64_t off = 0; off < bytes; off += kMaxMessage) {
    const int n = static_cast<int>(std::min(kMaxMessage, bytes - off));
    MPI_Send(p + off, n, MPI_BYTE, to, 0, MPI_COMM_WORLD);
  }
}

void receive_bytes(void* data, int64_t bytes, int from) {
  char* p = static_cast<char*>(data);
  for (int64_t off = 0; off < bytes; off += kMaxMessage) {
    const int n = static_cast<int>(std::min(kMaxMessage, bytes - off));
    MPI_Recv(p + off, n, MPI_BYTE, from, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
}

void broadcast_bytes(void* data, int64_t bytes, int root) {
  char* p = static_cast<char*>(data);
  for (int64_t off = 0; off < bytes; off += kMaxMessage) {
    const int n = static_cast<int>(std::min(kMaxMessage, bytes - off));
    MPI_Bcast(p + off, n, MPI_BYTE, root, MPI_COMM_WORLD);
  }
}
#endif

/// A tensor's bytes as the collectives send them: float64 or int64, contiguous.
torch::Tensor wire_form(const torch::Tensor& t, const char* what) {
  PK_CHECK(t.defined(), what << ": the tensor is undefined");
  PK_CHECK(t.scalar_type() == torch::kFloat64 || t.scalar_type() == torch::kLong,
           what << ": tensors travel as float64 or int64 (got " << t.scalar_type() << ")");
  return t.contiguous();
}

}  // namespace

bool built_with_mpi() {
#ifdef PATHKERNEL_WITH_MPI
  return true;
#else
  return false;
#endif
}

DistributedSession::DistributedSession(int* argc, char*** argv) {
  static Communicator world;
  the_world = &world;
#ifdef PATHKERNEL_WITH_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!launched_by_mpi() || initialized) return;
  int provided = 0;
  // Only the main thread calls MPI; LibTorch's and BLAS's threads never do.
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  mpi_started = true;
  // A failed call ends the job with MPI's message rather than returning codes
  // nobody checks (the default, made explicit).
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  MPI_Comm_rank(MPI_COMM_WORLD, &world.rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world.size_);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  MPI_Comm_size(local, &world.local_size_);
  MPI_Comm_free(&local);
#else
  (void)argc;
  (void)argv;
#endif
}

DistributedSession::~DistributedSession() {
#ifdef PATHKERNEL_WITH_MPI
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (mpi_started && !finalized) MPI_Finalize();
#endif
}

const Communicator& Communicator::world() {
  // Without a session (the tests, a program of the library's users), one rank.
  static Communicator alone;
  return the_world != nullptr ? *the_world : alone;
}

void Communicator::check(const std::string& error) const {
  if (size_ == 1) {
    if (!error.empty()) throw AgreedError(error);
    return;
  }
#ifdef PATHKERNEL_WITH_MPI
  const int mine = error.empty() ? size_ : rank_;
  int first = size_;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first == size_) return;
  const int failed_here = error.empty() ? 0 : 1;
  int failed = 0;
  MPI_Allreduce(&failed_here, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  const std::string message = broadcast(error, first);
  // An error of every rank (a bad option, a missing run) is the job's; one of
  // some ranks only says where it happened.
  if (failed == size_) throw AgreedError(message);
  throw AgreedError("rank " + std::to_string(first) + " of " + std::to_string(size_) + ": " + message);
#endif
}

std::string Communicator::broadcast(const std::string& text, int root) const {
  if (size_ == 1) return text;
  std::string out = text;
#ifdef PATHKERNEL_WITH_MPI
  int64_t length = static_cast<int64_t>(text.size());
  MPI_Bcast(&length, 1, MPI_INT64_T, root, MPI_COMM_WORLD);
  out.resize(static_cast<size_t>(length));
  broadcast_bytes(out.data(), length, root);
#else
  (void)root;
#endif
  return out;
}

int64_t Communicator::sum(int64_t value) const {
  int64_t out = value;
#ifdef PATHKERNEL_WITH_MPI
  if (size_ > 1) MPI_Allreduce(&value, &out, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
#endif
  return out;
}

double Communicator::max(double value) const {
  double out = value;
#ifdef PATHKERNEL_WITH_MPI
  if (size_ > 1) MPI_Allreduce(&value, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
#endif
  return out;
}

std::vector<double> Communicator::all_gather(double value) const {
  std::vector<double> out(static_cast<size_t>(size_), value);
#ifdef PATHKERNEL_WITH_MPI
  if (size_ > 1) MPI_Allgather(&value, 1, MPI_DOUBLE, out.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
#endif
  return out;
}

torch::Tensor Communicator::gather_rows(const torch::Tensor& t_in, int root) const {
  const torch::Tensor t = wire_form(t_in, "gather_rows");
  PK_CHECK(t.dim() >= 1, "gather_rows: the tensor needs a row dimension (got a scalar)");
  if (size_ == 1) return t;
#ifdef PATHKERNEL_WITH_MPI
  // Every rank's rows and row size, to check the shapes agree before any data moves.
  const int64_t row = t.numel() / std::max<int64_t>(1, t.size(0));
  const int64_t mine[3] = {t.size(0), t.size(0) > 0 ? row : -1,
                           static_cast<int64_t>(t.scalar_type())};
  std::vector<int64_t> all(3 * static_cast<size_t>(size_));
  MPI_Allgather(mine, 3, MPI_INT64_T, all.data(), 3, MPI_INT64_T, MPI_COMM_WORLD);
  int64_t rows = 0, row_numel = -1;
  for (int r = 0; r < size_; ++r) {
    rows += all[3 * r];
    if (all[3 * r] > 0) {
      PK_ASSERT(row_numel < 0 || all[3 * r + 1] == row_numel);
      row_numel = all[3 * r + 1];
    }
    PK_ASSERT(all[3 * r + 2] == mine[2]);
  }
  if (rank_ != root) {
    if (t.numel() > 0) send_bytes(t.data_ptr(), t.numel() * static_cast<int64_t>(t.element_size()), root);
    return torch::Tensor();
  }
  std::vector<int64_t> shape = t.sizes().vec();
  shape[0] = rows;
  torch::Tensor out = torch::empty(shape, t.options());
  int64_t at = 0;
  for (int r = 0; r < size_; ++r) {
    const int64_t n = all[3 * r];
    if (n == 0) continue;
    torch::Tensor part = out.narrow(0, at, n);
    if (r == root) {
      part.copy_(t);
    } else {
      receive_bytes(part.data_ptr(), part.numel() * static_cast<int64_t>(part.element_size()), r);
    }
    at += n;
  }
  return out;
#else
  (void)root;
  return t;
#endif
}

namespace {

/// Checks that `other` is a rank of the job other than this one.
void check_peer(const Communicator& comm, int other, const char* what) {
  PK_CHECK(other >= 0 && other < comm.size() && other != comm.rank(),
           what << ": rank " << other << " is not another rank of this job (rank " << comm.rank() << " of "
                << comm.size() << ")");
}

}  // namespace

void Communicator::send(const torch::Tensor& t_in, int to) const {
  const torch::Tensor t = wire_form(t_in, "send");
  check_peer(*this, to, "send");
#ifdef PATHKERNEL_WITH_MPI
  send_bytes(t.data_ptr(), t.numel() * static_cast<int64_t>(t.element_size()), to);
#else
  (void)t;  // a world of one has no other rank: check_peer threw
#endif
}

void Communicator::receive(torch::Tensor& into, int from) const {
  PK_CHECK(into.defined() && into.is_contiguous() &&
               (into.scalar_type() == torch::kFloat64 || into.scalar_type() == torch::kLong),
           "receive: the tensor to receive into must be a contiguous float64 or int64 tensor");
  check_peer(*this, from, "receive");
#ifdef PATHKERNEL_WITH_MPI
  receive_bytes(into.data_ptr(), into.numel() * static_cast<int64_t>(into.element_size()), from);
#endif
}

void Communicator::abort(int status) const {
#ifdef PATHKERNEL_WITH_MPI
  if (mpi_started) MPI_Abort(MPI_COMM_WORLD, status);
#endif
  std::_Exit(status);
}

std::vector<int64_t> split_by_cost(const std::vector<double>& costs, int parts) {
  PK_CHECK(parts >= 1, "split_by_cost: the number of parts must be >= 1 (got " << parts << ")");
  double total = 0;
  for (double c : costs) {
    PK_CHECK(c >= 0, "split_by_cost: costs must be >= 0 (got " << c << ")");
    total += c;
  }
  const int64_t n = static_cast<int64_t>(costs.size());
  std::vector<int64_t> bounds(static_cast<size_t>(parts) + 1, n);
  bounds[0] = 0;
  if (total <= 0) {  // nothing to weigh: equal counts, the extra items to the first ranks
    for (int r = 1; r < parts; ++r) bounds[r] = (n / parts) * r + std::min<int64_t>(r, n % parts);
    return bounds;
  }
  double running = 0;
  int64_t i = 0;
  for (int r = 1; r < parts; ++r) {
    const double target = total * r / parts;
    // Take items while the cumulative cost stays at or below r parts.
    while (i < n && running + costs[i] <= target) {
      running += costs[i];
      ++i;
    }
    // An item straddling the target goes where it leaves the smaller excess.
    if (i < n && target - running > running + costs[i] - target) {
      running += costs[i];
      ++i;
    }
    bounds[r] = std::max(i, bounds[r - 1]);
  }
  return bounds;
}

}  // namespace pathkernel
