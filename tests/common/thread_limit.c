/* pthread_create that fails with EAGAIN once kvo_test_threads_left reaches 0 (a negative count:
 * never), as it does in a container at its pids limit; otherwise the next definition's (libc's,
 * or a sanitizer's interceptor). Linked into a test binary's executable, whose symbols the
 * dynamic linker finds first. C, not C++: glibc declares pthread_create noexcept for C++. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>

int kvo_test_threads_left = -1;

int pthread_create(pthread_t* restrict thread, const pthread_attr_t* restrict attr,
                   void* (*start)(void*), void* restrict arg) {
  typedef int (*create_fn)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static create_fn next = NULL;
  if (kvo_test_threads_left == 0) return EAGAIN;
  if (kvo_test_threads_left > 0) --kvo_test_threads_left;
  if (next == NULL) {
    union {
      void* p;
      create_fn f;
    } sym = {dlsym(RTLD_NEXT, "pthread_create")};
    next = sym.f;
  }
  return next(thread, attr, start, arg);
}
