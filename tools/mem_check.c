/* Host memory check of the tools (see mem_check.h). */
#include "tools/mem_check.h"

#include "models/memory_estimate.h"

#include <stdio.h>
#include <string.h>

int dg_check_host_memory(const char *cmd, const char *what, double need) {
    const double avail = dg_memory_available();
    if (avail <= 0 || need <= avail) return 0;
    fprintf(stderr, "%s: %s needs about %.1f GiB of host memory; %.1f GiB is available. Use smaller sizes.\n", cmd,
            what, need / 1073741824.0, avail / 1073741824.0);
    return -1;
}

void dg_note_device_memory_unchecked(const char *cmd) {
    fprintf(stderr,
            "%s: note: device memory is not checked before the run (the library does not report the "
            "device's free memory)\n",
            cmd);
}
