// Memory for the eviction policies' big tables. At a million blocks a policy's key index and
// nodes are tens of MiB read at random; with 4 KiB pages nearly every access also misses the
// TLB and walks the page tables. Tables of 2 MiB and more are anonymous mappings (zeroed)
// advised MADV_HUGEPAGE, which the kernel backs with huge pages (resident 2 MiB at a time as
// they are written) where transparent huge pages are in `madvise` mode (Debian's and most
// distributions' default) or `always`, and with small pages where it refuses. At 1M blocks
// that took lru's lookups from 260-276 to 222-237 ns and arc's from 264-291 to 175-210
// (kvoffload-bench policy, alternating, same hour).
#ifndef KVOFFLOAD_SRC_HUGE_PAGES_H_
#define KVOFFLOAD_SRC_HUGE_PAGES_H_

#include <sys/mman.h>

#include <cstddef>
#include <new>

namespace kvoffload {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// For std::vector: a mapping from 2 MiB up, operator new below.
template <typename T>
class HugePageAllocator {
 public:
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  explicit HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    // Aligned new: key lists' nodes are aligned to 32 bytes (mappings are page-aligned).
    if (bytes < kHugePageBytes) {
      return static_cast<T*>(::operator new(bytes, std::align_val_t{alignof(T)}));
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    ::madvise(p, bytes, MADV_HUGEPAGE);  // advice only: small pages where it is refused
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) noexcept {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePageBytes) {
      ::operator delete(p, std::align_val_t{alignof(T)});
    } else {
      ::munmap(p, bytes);
    }
  }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_HUGE_PAGES_H_
