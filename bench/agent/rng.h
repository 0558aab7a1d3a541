// The trace generators' random numbers: splitmix64 and the few samplers they need, written out
// so that a seed gives the same trace on every standard library (std::*_distribution does not).
// Thread-compatible.
#ifndef KVOFFLOAD_BENCH_AGENT_RNG_H_
#define KVOFFLOAD_BENCH_AGENT_RNG_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvoffload::bench {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  size_t Below(size_t n) { return static_cast<size_t>(Next() % std::max<size_t>(n, 1)); }
  // Uniform in [lo, hi].
  size_t Between(size_t lo, size_t hi) { return lo + Below(hi - lo + 1); }
  // Exponential with the given mean (inter-arrival and think times).
  double Exponential(double mean) { return -mean * std::log1p(-Uniform()); }

 private:
  uint64_t state_;
};

// Zipf(s) over n ranks (rank 0 most popular), sampled by binary search of the CDF.
class Zipf {
 public:
  Zipf(size_t n, double s) : cdf_(std::max<size_t>(n, 1)) {
    double sum = 0;
    for (size_t i = 0; i < cdf_.size(); ++i) {
      sum += 1.0 / std::pow(static_cast<double>(i + 1), s);
      cdf_[i] = sum;
    }
    for (double& c : cdf_) c /= sum;
  }
  size_t Sample(Rng& rng) const {
    const auto it = std::lower_bound(cdf_.begin(), cdf_.end(), rng.Uniform());
    return std::min<size_t>(static_cast<size_t>(it - cdf_.begin()), cdf_.size() - 1);
  }

 private:
  std::vector<double> cdf_;
};

}  // namespace kvoffload::bench

#endif  // KVOFFLOAD_BENCH_AGENT_RNG_H_
