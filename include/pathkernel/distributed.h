// Several processes on one job: the ranks of an MPI launch (mpirun, srun),
// their collectives in a fixed order, and errors every rank agrees on.
//
// MPI starts only when a launcher started the process (DistributedSession
// looks for the launcher's environment: OMPI_COMM_WORLD_SIZE, PMIX_RANK,
// PMI_RANK, PMI_SIZE); a process started by hand, and every process of a
// build without MPI (cmake -DPATHKERNEL_WITH_MPI=OFF), is a world of one
// rank, in which every collective below returns its own input. Code written
// against Communicator therefore runs unchanged in one process.
//
// Collectives are called by every rank in the same order, from the thread
// that started MPI. Tensors travel as float64 or int64, contiguous, row-major.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/error.h"

namespace pathkernel {

/// Starts MPI for the lifetime of the object when the process was started by
/// an MPI launcher, and finalizes it at the end; otherwise does nothing. One
/// per process, in main(), before anything else uses Communicator.
class DistributedSession {
 public:
  DistributedSession(int* argc, char*** argv);
  ~DistributedSession();
  DistributedSession(const DistributedSession&) = delete;
  DistributedSession& operator=(const DistributedSession&) = delete;
};

/// Whether this build can run on several processes (built with MPI).
bool built_with_mpi();

/// An error that every rank of the job has agreed on (Communicator::check):
/// each rank throws it, and only rank 0 needs to show it.
class AgreedError : public Error {
 public:
  explicit AgreedError(const std::string& message) : Error(message) {}
};

/// The processes of the job (MPI_COMM_WORLD), or this process alone.
class Communicator {
 public:
  /// The job's world: every rank the launcher started (one without MPI).
  static const Communicator& world();

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool root() const { return rank_ == 0; }
  /// Ranks on this machine (MPI_COMM_TYPE_SHARED), to share its cores.
  int local_size() const { return local_size_; }

  /// Every rank passes its own error ("" for none). Throws AgreedError on
  /// every rank when any rank's is non-empty, with the message of the lowest
  /// failing rank (prefixed "rank R: " in a world of more than one).
  void check(const std::string& error) const;
  /// Runs f on every rank and checks (above) that it threw no
  /// std::exception on any rank; f's own exception is kept as the message.
  template <class F>
  void agree(F&& f) const {
    std::string error;
    try {
      f();
    } catch (const std::exception& e) {
      error = e.what();
    }
    check(error);
  }

  /// root's string on every rank.
  std::string broadcast(const std::string& text, int root = 0) const;
  /// The sum and the maximum over the ranks, on every rank.
  int64_t sum(int64_t value) const;
  double max(double value) const;
  /// Every rank's value, in rank order, on every rank.
  std::vector<double> all_gather(double value) const;

  /// Concatenation along dim 0 of every rank's tensor (float64 or int64; the
  /// same dtype and trailing shape on every rank, any number of rows, zero
  /// included), in rank order, on `root`; an undefined tensor on the others.
  torch::Tensor gather_rows(const torch::Tensor& t, int root = 0) const;
  /// Sends t (float64 or int64) to rank `to`, another rank than this one,
  /// which receives it with receive(); returns once t may be changed.
  void send(const torch::Tensor& t, int to) const;
  /// Receives from rank `from` (another rank) what it sent with send():
  /// `into` is float64 or int64, contiguous, of the sent tensor's dtype and
  /// number of elements, and is overwritten.
  void receive(torch::Tensor& into, int from) const;

  /// Ends every rank of the job with `status` (MPI_Abort). For an error seen
  /// by one rank only, after printing it: the others may be waiting in a
  /// collective. In a world of one, std::_Exit(status).
  [[noreturn]] void abort(int status) const;

 private:
  friend class DistributedSession;
  Communicator() = default;
  int rank_ = 0;
  int size_ = 1;
  int local_size_ = 1;
};

/// A contiguous share of a list of work items for each of `parts` ranks,
/// balanced by cost: bounds [parts + 1], rank r takes items [bounds[r],
/// bounds[r+1]). Each share ends where the cumulative cost first reaches
/// r+1 parts of the total, so no share exceeds its part by more than one
/// item's cost. costs: >= 0, one per item; parts >= 1.
std::vector<int64_t> split_by_cost(const std::vector<double>& costs, int parts);

}  // namespace pathkernel
