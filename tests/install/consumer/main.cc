// consumer ADDRESS DATASET: streams one epoch of DATASET from conveyord through the installed
// client library and prints "rows R batches B first F" (F: the first dense value of the
// first stream), or the error.
#include <cstdio>
#include <string>

#include "client/cpp/conveyor_client.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: consumer ADDRESS DATASET\n");
    return 2;
  }
  auto client = conveyor::Client::Connect(argv[1]);
  if (!client.ok()) {
    std::fprintf(stderr, "consumer: %s\n", std::string(client.status().message()).c_str());
    return 1;
  }
  conveyor::v1::Subscribe request;
  request.set_dataset(argv[2]);
  request.set_minibatch_size(64);
  request.set_epochs(1);
  request.set_randomize(false);
  auto sub = (*client)->Subscribe(request);
  if (!sub.ok()) {
    std::fprintf(stderr, "consumer: %s\n", std::string(sub.status().message()).c_str());
    return 1;
  }
  conveyor::ReceivedBatch batch;
  uint64_t rows = 0, batches = 0;
  double first = 0;
  while (true) {
    auto more = (*sub)->Next(&batch);
    if (!more.ok()) {
      std::fprintf(stderr, "consumer: %s\n", std::string(more.status().message()).c_str());
      return 1;
    }
    if (!*more) break;
    if (batches == 0) {
      auto dense = batch.Dense<float>(0);
      if (!dense.ok()) {
        std::fprintf(stderr, "consumer: %s\n", std::string(dense.status().message()).c_str());
        return 1;
      }
      first = dense->data[0];
    }
    rows += batch.descriptor().rows();
    ++batches;
  }
  std::printf("rows %llu batches %llu first %.9g\n", static_cast<unsigned long long>(rows),
              static_cast<unsigned long long>(batches), first);
  return 0;
}
