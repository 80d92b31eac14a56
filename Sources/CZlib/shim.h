#ifndef CZLIB_SHIM_H
#define CZLIB_SHIM_H

// zlib (zlib1g-dev), for its CRC-32 only: the cache checks every body it did not write itself
// before serving it, and zlib's crc32_z runs at memory speed, in a debug build too.
#include <zlib.h>

#endif
