/* The memory a tool run needs, checked before the run allocates it. */
#ifndef DG_TOOLS_MEM_CHECK_H
#define DG_TOOLS_MEM_CHECK_H

#include "deltagrad.h"

/* 0 when a run that needs about need bytes of host memory fits in what is available
 * (dg_memory_available, models/memory_estimate.h: MemAvailable, within a container's limit), or
 * the amount cannot be read; -1 after "cmd: WHAT needs about X GiB of host memory, Y GiB available"
 * on stderr. */
int dg_check_host_memory(const char *cmd, const char *what, double need);

/* "cmd: device memory not checked (...)" on stderr: the library reports no free device memory,
 * so a device run's size is not checked before it starts. */
void dg_note_device_memory_unchecked(const char *cmd);

#endif
