/* Linked into the test binaries marked SINGLE_THREADED (tests/CMakeLists.txt), which the TSan
 * tree leaves out because a race needs two threads. This keeps the mark true: the executable's
 * own pthread_create is the one every library in the process calls (std::thread in libstdc++
 * included: the dynamic linker looks in the executable first), so a test that starts a thread
 * aborts here, saying what to change, instead of losing its TSan run without a word. C, not
 * C++: glibc declares pthread_create noexcept for C++, which a definition would have to repeat. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

int pthread_create(pthread_t* restrict thread, const pthread_attr_t* restrict attr,
                   void* (*start)(void*), void* restrict arg) {
  (void)thread;
  (void)attr;
  (void)start;
  (void)arg;
  fputs("this test binary is marked SINGLE_THREADED in its CMakeLists.txt, so the TSan build "
        "leaves it out, but it started a thread: remove the mark\n",
        stderr);
  abort();
}
