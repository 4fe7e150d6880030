// malloc_tuning.h: process-wide allocator settings for a streaming loader.
#pragma once

namespace conveyor {

// Parsed chunks are large, short-lived and of similar sizes. glibc would serve each from a
// fresh mmap and return it on free, so every chunk pays page faults and kernel zeroing
// (measured: ~40% of the second parser thread's gain on 2 cores). Keeping freed memory in
// the heap lets the next chunk reuse it; the footprint stays bounded by the chunks in
// flight. Call once at startup, before threads start.
void TuneAllocatorForStreaming();

}  // namespace conveyor
