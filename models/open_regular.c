/* Opening regular input files only (models/open_regular.h). */
#include "models/open_regular.h"

#include "core/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *kind_of(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a plain file";
}

FILE *dg_fopen_regular(const char *path, const char *what) {
    /* O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        dg_error("%s: cannot open '%s': %s", what, path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        dg_error("%s: cannot stat '%s': %s", what, path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        dg_error("%s: '%s' is %s, not a regular file", what, path, kind_of(st.st_mode));
        close(fd);
        return NULL;
    }
    int fl = fcntl(fd, F_GETFL);
    FILE *f = fl >= 0 && fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        dg_error("%s: cannot read '%s': %s", what, path, strerror(errno));
        close(fd);
    }
    return f;
}
