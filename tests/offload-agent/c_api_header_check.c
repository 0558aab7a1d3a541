/* Compiled as C: proves kvoffload/c.h is a C header, and drives one store/lookup/load round
 * trip from C so the test binary exercises the API the way an FFI caller does. */
#include <string.h>

#include "kvoffload/c.h"

int kvo_c_round_trip(size_t block_bytes) {
  kvo_options o;
  memset(&o, 0, sizeof(o));
  o.struct_size = sizeof(o);
  o.block_bytes = block_bytes;
  o.model = "c-model";
  o.cpu_bytes = 4 * 4096;
  kvo_engine* e = NULL;
  if (kvo_engine_create(&o, &e) != KVO_OK) return 1;
  static unsigned char block[4000];
  static unsigned char back[4000];
  memset(block, 0x5A, sizeof(block));
  kvo_key key = {1, 2};
  void* ptr = block;
  uint64_t job = 0;
  int rc = 0;
  if (kvo_store(e, &key, &ptr, 1, &job) != KVO_OK || kvo_job_wait(e, job) != KVO_OK) rc = 2;
  size_t prefix = 0;
  int32_t tier = -1;
  if (rc == 0 && (kvo_lookup(e, &key, 1, &prefix, &tier) != KVO_OK || prefix != 1 ||
                  tier != KVO_TIER_CPU)) {
    rc = 3;
  }
  ptr = back;
  if (rc == 0 && (kvo_load(e, &key, &ptr, 1, &job) != KVO_OK || kvo_job_wait(e, job) != KVO_OK ||
                  memcmp(block, back, sizeof(block)) != 0)) {
    rc = 4;
  }
  kvo_engine_destroy(e);
  return rc;
}
