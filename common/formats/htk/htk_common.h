// htk_common.h: internal to formats/htk/: the small readers its two deserializers share
// (HTK features, htk_features.cc; MLF labels, mlf.cc).
#pragma once

#include <charconv>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>

namespace conveyor::htk {

template <typename T>
inline T Load(const char* p, bool big_endian) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  if (big_endian) {
    if constexpr (sizeof(T) == 2) {
      uint16_t u;
      std::memcpy(&u, &v, 2);
      u = __builtin_bswap16(u);
      std::memcpy(&v, &u, 2);
    } else if constexpr (sizeof(T) == 4) {
      uint32_t u;
      std::memcpy(&u, &v, 4);
      u = __builtin_bswap32(u);
      std::memcpy(&v, &u, 4);
    }
  }
  return v;
}

inline bool ParseInt(std::string_view s, int64_t* out) {
  auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return !s.empty() && r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// The path without its last extension (a '.' after the last '/').
inline std::string StripExtension(std::string_view s) {
  const size_t dot = s.rfind('.');
  const size_t slash = s.rfind('/');
  if (dot != std::string_view::npos && (slash == std::string_view::npos || dot > slash)) s = s.substr(0, dot);
  return std::string(s);
}

}  // namespace conveyor::htk
