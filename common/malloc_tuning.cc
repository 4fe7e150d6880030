#include "common/malloc_tuning.h"

#include <malloc.h>

namespace conveyor {

void TuneAllocatorForStreaming() {
#ifdef M_MMAP_THRESHOLD
  mallopt(M_MMAP_THRESHOLD, 1 << 30);  // serve chunk buffers from the heap...
  mallopt(M_TRIM_THRESHOLD, 1 << 30);  // ...and keep freed ones for the next chunk
  mallopt(M_TOP_PAD, 64 << 20);
#endif
}

}  // namespace conveyor
