// KVOFFLOAD_EXPORT marks the public API of libkvoffload.so. Everything else is built with
// hidden visibility, so the library exports no internals (nor the template instantiations of
// the header-only libraries it uses) into the inference process it is loaded into.
#ifndef KVOFFLOAD_EXPORT_H_
#define KVOFFLOAD_EXPORT_H_

#if defined(__GNUC__)
#define KVOFFLOAD_EXPORT __attribute__((visibility("default")))
#else
#define KVOFFLOAD_EXPORT
#endif

#endif  // KVOFFLOAD_EXPORT_H_
