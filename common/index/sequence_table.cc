#include "common/index/sequence_table.h"

#include <utility>

namespace conveyor {

SequenceTable::SequenceTable(const SequenceTable& other) : owned_(other.begin(), other.end()) {
  Sync();
}

SequenceTable& SequenceTable::operator=(const SequenceTable& other) {
  if (this != &other) {
    HugeVector<SequenceEntry> copy(other.begin(), other.end());
    owned_.swap(copy);
    keepalive_.reset();
    Sync();
  }
  return *this;
}

SequenceTable::SequenceTable(SequenceTable&& other) noexcept
    : owned_(std::move(other.owned_)),
      keepalive_(std::move(other.keepalive_)),
      data_(other.data_),
      size_(other.size_) {
  other.owned_.clear();
  other.keepalive_.reset();
  other.Sync();
}

SequenceTable& SequenceTable::operator=(SequenceTable&& other) noexcept {
  if (this != &other) {
    owned_ = std::move(other.owned_);
    keepalive_ = std::move(other.keepalive_);
    data_ = other.data_;
    size_ = other.size_;
    other.owned_.clear();
    other.keepalive_.reset();
    other.Sync();
  }
  return *this;
}

SequenceTable SequenceTable::Borrowed(std::shared_ptr<const void> keepalive,
                                      const SequenceEntry* records, size_t size) {
  SequenceTable t;
  t.keepalive_ = std::move(keepalive);
  t.data_ = records;
  t.size_ = size;
  return t;
}

void SequenceTable::Detach() {
  HugeVector<SequenceEntry> copy(data_, data_ + size_);
  owned_.swap(copy);
  keepalive_.reset();
  Sync();
}

void SequenceTable::clear() {
  keepalive_.reset();
  owned_.clear();
  Sync();
}

SequenceTable::iterator SequenceTable::erase(iterator first, iterator last) {
  HugeVector<SequenceEntry>& v = Owned();
  const auto from = v.begin() + (first - v.data());
  const auto it = v.erase(from, from + (last - first));
  Sync();
  return v.data() + (it - v.begin());
}

void SequenceTable::swap(HugeVector<SequenceEntry>& v) {
  Owned().swap(v);
  Sync();
}

void SequenceTable::swap(SequenceTable& other) noexcept {
  std::swap(owned_, other.owned_);
  std::swap(keepalive_, other.keepalive_);
  std::swap(data_, other.data_);
  std::swap(size_, other.size_);
}

}  // namespace conveyor
