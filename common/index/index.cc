#include "common/index/index.h"

#include "common/hash.h"

namespace conveyor {

void Index::BuildChunks(uint64_t chunk_size) {
  chunks.clear();
  total_samples = 0;
  ChunkEntry cur;
  uint64_t cur_bytes = 0;
  const SequenceTable& seqs = sequences;  // const: a borrowed table is read in place
  for (uint64_t i = 0; i < seqs.size(); ++i) {
    const SequenceEntry& s = seqs[i];
    if (cur.num_sequences > 0 && cur_bytes + s.size > chunk_size) {
      chunks.push_back(cur);
      cur = ChunkEntry();
      cur_bytes = 0;
    }
    if (cur.num_sequences == 0) {
      cur.first_sequence = i;
      cur.begin_offset = s.offset;
    }
    ++cur.num_sequences;
    cur.num_samples += s.num_samples;
    cur.end_offset = s.offset + s.size;
    cur_bytes += s.size;
    total_samples += s.num_samples;
  }
  if (cur.num_sequences > 0) chunks.push_back(cur);
}

void Index::ComputeContentHash() {
  const SequenceTable& seqs = sequences;  // const: a borrowed table is read in place
  content_hash = Hash64(seqs.data(), seqs.size() * sizeof(SequenceEntry));
  for (const std::string& n : names) content_hash = Hash64(n.data(), n.size(), content_hash);
}

}  // namespace conveyor
