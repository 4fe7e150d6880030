// subscribe.h: the protocol's Subscribe message <-> the StreamRequest it asks for, both
// directions in one place: the daemon reads a Subscribe with SubscribeToRequest(), the C++
// client and the CLI write one with MakeSubscribe(). (The Python client builds its
// Subscribe itself, in client/python/conveyor/client.py, Client.subscribe.)
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/sampling/stream_request.h"
#include "conveyor/v1/conveyor.pb.h"

namespace conveyor {

// Layouts and dtypes a Subscribe may name.
inline constexpr int kMaxSubscribeMaps = 1024;

// The Subscribe message for `request` (what the CLI's stream flags ask for) on `dataset`.
// Credits and transport are left to the caller.
v1::Subscribe MakeSubscribe(const std::string& dataset, const StreamRequest& request);

// The StreamRequest a Subscribe asks for: layouts, dtypes, modes, distribution, sizes and
// the cursor. Dataset, transport and credits are the caller's to check; `threads` is left
// at its default. Errors: InvalidArgument naming the field (an unknown enum value, too many
// layouts or dtypes, parallel without truncation, truncation past 2^20, a dtype other than
// float16/bfloat16). Hostile input: every map and number is bounded here.
absl::StatusOr<StreamRequest> SubscribeToRequest(const v1::Subscribe& s);

}  // namespace conveyor
