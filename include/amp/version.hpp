#pragma once
// amp's version, the one source of it: CMake's project version is read from here.
#define AMP_VERSION_MAJOR 0
#define AMP_VERSION_MINOR 2
#define AMP_VERSION_PATCH 0
#define AMP_VERSION_STRING "0.2.0"
