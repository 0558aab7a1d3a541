// The name a process gives the files it creates in a tier (writer files, temp files, probes).
#ifndef KVOFFLOAD_SRC_PROCESS_TAG_H_
#define KVOFFLOAD_SRC_PROCESS_TAG_H_

#include <string>

namespace kvoffload {

// "<pid>-<16 hex digits>": the pid, for a person reading a directory, and 64 random bits drawn
// once per process. The pid alone is not unique in a shared (ReadWriteMany) tier: every pod has
// a pid namespace of its own, and replicas started alike run their engines at the same pids, so
// a second replica found the first one's writer file under its own name and could not open the
// tier. A child forked after the first call keeps the random part but has its own pid.
std::string ProcessTag();

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_PROCESS_TAG_H_
