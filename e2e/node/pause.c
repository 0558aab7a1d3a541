// The pod sandbox's process for the e2e node (containerd's sandbox_image): it only holds the
// pod's namespaces. Built static so that its image is this one file. It exits on SIGTERM or
// SIGINT, and reaps children, which a pod sharing its PID namespace leaves to it.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void Stop(int sig) { _exit(sig == SIGTERM ? 0 : 2); }

static void Reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction stop = {.sa_handler = Stop};
  struct sigaction reap = {.sa_handler = Reap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGTERM, &stop, NULL) != 0 || sigaction(SIGINT, &stop, NULL) != 0 ||
      sigaction(SIGCHLD, &reap, NULL) != 0) {
    return 1;
  }
  for (;;) pause();
}
