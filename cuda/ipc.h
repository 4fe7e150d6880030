// ipc.h: CUDA IPC of device memory between processes on one host (the daemon exports its
// device slot blocks once; same-host GPU clients open them once). Without the CUDA
// backend every call is Unimplemented. Handles are opaque bytes (cudaIpcMemHandle_t);
// devices are named by UUID, since ordinals differ between processes (CUDA_VISIBLE_DEVICES).
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace conveyor::gpu {

inline constexpr size_t kIpcHandleBytes = 64;
inline constexpr size_t kDeviceUuidBytes = 16;

// The handle of `base`, the start of a cudaMalloc allocation on `device`. Errors:
// Unimplemented (no CUDA backend), Internal (the CUDA call, with its error).
absl::StatusOr<std::string> ExportIpcHandle(const void* base, int device);
// The 16-byte UUID of `device` in this process.
absl::StatusOr<std::string> DeviceUuid(int device);
// This process's ordinal of the device with `uuid`. Errors: NotFound (not visible here).
absl::StatusOr<int> DeviceByUuid(const std::string& uuid);
// Opens a handle exported by another process (a process cannot open its own) on `device`:
// the device address of the block, until CloseIpcHandle. Errors: InvalidArgument (not a
// handle), Internal (the CUDA call: e.g. the exporter is gone).
absl::StatusOr<void*> OpenIpcHandle(const std::string& handle, int device);
void CloseIpcHandle(void* ptr, int device);

}  // namespace conveyor::gpu
