// The shared client library (libconveyor_client.so) is made of the client's static archives
// linked whole; this file gives the target a source of its own and the library its version.
#include "common/version.h"

namespace conveyor {

// The version of the installed client library (the project's VERSION).
extern "C" const char* conveyor_client_version() { return CONVEYOR_VERSION; }

}  // namespace conveyor
