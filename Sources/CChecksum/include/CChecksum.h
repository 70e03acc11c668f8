// CRC-32C (Castagnoli) with the processor's own instruction, where it has one: the checksum of
// every record of the node's log (docs/PROTOCOL.md, Appendix B). StateSync's Swift code keeps a
// table-driven implementation for every other processor, and checks one against the other.
#ifndef STATESYNC_CCHECKSUM_H
#define STATESYNC_CCHECKSUM_H

#include <stddef.h>
#include <stdint.h>

/// 1 when `statesync_crc32c_hardware` may be called on this processor (x86-64 with SSE 4.2), else 0.
int statesync_crc32c_hardware_available(void);

/// Continues the CRC-32C `crc` (already inverted: pass 0xFFFFFFFF to start, and invert the
/// result to finish) over `count` bytes at `bytes`. Only when the hardware is available.
uint32_t statesync_crc32c_hardware(uint32_t crc, const uint8_t *bytes, size_t count);

#endif
