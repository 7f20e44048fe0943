// How far the replay of a compact recorded run drifted from its checkpoints,
// and what that means for the decomposition, in plain words.
#include <algorithm>
#include <cstdio>
#include <string>

#include "pathkernel/path.h"

namespace pathkernel {

double ReplayDrift::max() const {
  double m = 0;
  for (double d : max_abs_diff) m = std::max(m, d);
  return m;
}

int64_t ReplayDrift::worst_step() const {
  int64_t at = -1;
  double m = 0;
  for (size_t i = 0; i < max_abs_diff.size(); ++i) {
    if (max_abs_diff[i] > m) {
      m = max_abs_diff[i];
      at = steps[i];
    }
  }
  return at;
}

int64_t ReplayDrift::bit_for_bit() const {
  return static_cast<int64_t>(std::count(bitwise_equal.begin(), bitwise_equal.end(), true));
}

std::string replay_drift_message(const ReplayDrift& drift, double weight_scale) {
  char buf[1536];
  const long long n = static_cast<long long>(drift.steps.size());
  if (drift.max() == 0) {
    const long long bits = static_cast<long long>(drift.bit_for_bit());
    const std::string how = bits == n ? "bit for bit" : std::to_string(bits) + " bit for bit, the rest equal in value";
    std::snprintf(buf, sizeof buf,
                  "replay reproduced all %lld recorded checkpoints (%s): the replayed steps are the loop's own, and "
                  "each C_i is the training point's contribution along the path the loop took",
                  n, how.c_str());
    return buf;
  }
  const double rel = drift.max() / std::max(weight_scale, 1e-300);
  const int64_t worst = drift.worst_step();
  int64_t from = 0;  // the checkpoint the worst segment was replayed from
  for (size_t i = 1; i < drift.steps.size(); ++i) {
    if (drift.steps[i] == worst) from = drift.steps[i - 1];
  }
  std::snprintf(buf, sizeof buf,
                "replay drifted from the recorded weights by up to %.3g (%.3g relative to max |w_N| %.3g), worst at "
                "the checkpoint of step %lld (replayed from step %lld: a step of the loop in between did what the "
                "replay did not, or ran other arithmetic); %lld of %lld checkpoints were reproduced bit for bit. Between "
                "checkpoints the decomposition follows the replayed steps and rejoins the recorded weights at each "
                "checkpoint, carrying the difference into E, so f(w_0) + sum C_i + R + E still equals f(w_N) at the "
                "recorded final weights; each C_i is the contribution along the replayed steps, which differ from "
                "the loop's by up to that much in the weights",
                drift.max(), rel, weight_scale, static_cast<long long>(worst), static_cast<long long>(from),
                static_cast<long long>(drift.bit_for_bit()), n);
  return buf;
}

}  // namespace pathkernel
