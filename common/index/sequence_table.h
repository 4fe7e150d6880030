// sequence_table.h: SequenceEntry (one sequence's record) and SequenceTable, the storage of
// Index::sequences. The records are either owned (a vector, as an indexer builds them) or borrowed
// from a read-only mapping of an index cache file, used in place: opening a 10^8-sequence dataset
// from its cache then costs no fresh memory and no copy of its 3.2 GB of records (issue 19).
//
// The interface is the part of std::vector<SequenceEntry> the code uses. Reading never copies.
// Every non-const member (push_back, resize, erase, the non-const operator[], data(), begin(),
// back(), ...) first turns a borrowed table into an owned copy ("detaches"), since the mapping
// is read-only: correct in every case, but a copy of all records, so code that only reads a
// loaded index must reach it through a const reference (as the readers and the planner do).
// Copying a table copies its records (an owned table); moving it moves the mapping.
// Not thread-safe for concurrent mutation; concurrent const access is safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/huge_pages.h"

namespace conveyor {

// One sequence. 32 bytes; trivially copyable (the cache file stores these records).
struct SequenceEntry {
  uint64_t key = 0;          // the numeric id as written, or the 0-based line number
  uint64_t offset = 0;       // byte offset of the sequence's first line in the file
  uint64_t line = 0;         // 0-based line number of that first line
  uint32_t size = 0;         // bytes, from `offset` to the end of its last line (newline included)
  uint32_t num_samples = 0;  // rows (or rows carrying the definesMBSize stream)
};
static_assert(sizeof(SequenceEntry) == 32, "SequenceEntry is a cache-file record");

class SequenceTable {
 public:
  using value_type = SequenceEntry;
  using size_type = size_t;
  using iterator = SequenceEntry*;
  using const_iterator = const SequenceEntry*;

  SequenceTable() = default;
  SequenceTable(const SequenceTable& other);
  SequenceTable& operator=(const SequenceTable& other);
  SequenceTable(SequenceTable&& other) noexcept;
  SequenceTable& operator=(SequenceTable&& other) noexcept;
  ~SequenceTable() = default;

  // A borrowed table: `size` records at `records`, which must stay valid and unchanged while
  // `keepalive` (the owner of the mapping: the table holds a reference) lives.
  static SequenceTable Borrowed(std::shared_ptr<const void> keepalive, const SequenceEntry* records,
                                size_t size);
  // True when the records are borrowed (used in place from a mapping).
  bool borrowed() const { return keepalive_ != nullptr; }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Records held: the vector's capacity when owned, the borrowed count otherwise.
  size_t capacity() const { return borrowed() ? size_ : owned_.capacity(); }

  const SequenceEntry* data() const { return data_; }
  const SequenceEntry& operator[](size_t i) const { return data_[i]; }
  const SequenceEntry& front() const { return data_[0]; }
  const SequenceEntry& back() const { return data_[size_ - 1]; }
  const_iterator begin() const { return data_; }
  const_iterator end() const { return data_ + size_; }
  const_iterator cbegin() const { return data_; }
  const_iterator cend() const { return data_ + size_; }

  // Non-const access: detaches a borrowed table first (see the file comment).
  SequenceEntry* data() { return Owned().data(); }
  SequenceEntry& operator[](size_t i) { return Owned()[i]; }
  SequenceEntry& front() { return Owned().front(); }
  SequenceEntry& back() { return Owned().back(); }
  iterator begin() { return Owned().data(); }
  iterator end() { return Owned().data() + size_; }

  void push_back(const SequenceEntry& e) {
    Owned().push_back(e);
    Sync();
  }
  void reserve(size_t n) {
    Owned().reserve(n);
    Sync();
  }
  void resize(size_t n) {
    Owned().resize(n);
    Sync();
  }
  void clear();
  // Erases [first, last), iterators of this table (from the non-const begin()/end()).
  iterator erase(iterator first, iterator last);
  // Exchanges the records with `v`: the table becomes owned; `v` receives the old records
  // (copied out of the mapping when the table was borrowed).
  void swap(HugeVector<SequenceEntry>& v);
  void swap(SequenceTable& other) noexcept;

 private:
  // The owned vector, after copying a borrowed table's records into it.
  HugeVector<SequenceEntry>& Owned() {
    if (borrowed()) Detach();
    return owned_;
  }
  void Detach();
  // Points data_/size_ at the owned vector after it changed.
  void Sync() {
    data_ = owned_.data();
    size_ = owned_.size();
  }

  HugeVector<SequenceEntry> owned_;       // the records when not borrowed (2 MiB pages: a 10^8 index is 3.2 GB)
  std::shared_ptr<const void> keepalive_;  // non-null when borrowed
  const SequenceEntry* data_ = nullptr;    // owned_.data() or the borrowed records
  size_t size_ = 0;
};

}  // namespace conveyor
