/* Files written atomically: the content goes to a temporary file in the same directory, which is
 * flushed, fsync'ed and renamed over the destination, then the directory is fsync'ed.  A reader
 * (or a run killed at any point) sees the old file or the new one, never a partial one; a crash
 * leaves at most a stray ".NAME.tmp-PID-N" file behind. */
#ifndef DG_MODELS_ATOMIC_FILE_H
#define DG_MODELS_ATOMIC_FILE_H

#include <stdio.h>

typedef struct dg_atomic_file {
    FILE *f;    /* write the content here */
    char *path; /* the destination */
    char *tmp;  /* the temporary file beside it */
} dg_atomic_file;

/* Opens the temporary file.  Returns 0, or -1 with dg_error set ("WHAT: cannot create ..."). */
int dg_atomic_open(dg_atomic_file *af, const char *path, const char *what);
/* fflush, fsync, fclose, rename over path, fsync the directory.  Returns 0, or -1 with dg_error
 * set (the temporary file is removed and the destination is left as it was). */
int dg_atomic_commit(dg_atomic_file *af, const char *what);
/* Gives up: closes and removes the temporary file.  Safe on a zeroed or already closed struct. */
void dg_atomic_abort(dg_atomic_file *af);

/* Removes the temporary files ".NAME.tmp-PID-N" in dir that a killed process left behind: those of a
 * PID that no longer runs, or of this process's PID (a previous process's, since this one has none
 * open when it calls this).  Another live process's are kept.  Other files are never touched.
 * Returns the number removed, or -1 with dg_error if dir cannot be read. */
int dg_atomic_remove_stale(const char *dir);

/* fsync of the directory holding path (so that a rename in it is durable).  0 or -1. */
int dg_fsync_parent_dir(const char *path);

#endif
