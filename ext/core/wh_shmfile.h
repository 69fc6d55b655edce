/* Files the project makes in shared memory (/dev/shm): the shm store's
 * segment and the batch ring's control and slot files. /dev/shm is writable
 * by every user, so anyone may have put a symlink or a file of theirs at
 * one of our paths first. These calls never follow a symlink, and hand back
 * a descriptor only for a regular file owned by this process's effective
 * uid with mode 0600 (no one else can read or write it): anything else is
 * refused, naming the path and why, and is never written, extended or
 * truncated. */
#ifndef WH_SHMFILE_H
#define WH_SHMFILE_H

#include <stdbool.h>
#include <stdint.h>

#include "wh.h"

/* Where those files are, and how each one's name starts: every name the
 * package makes there is spelled here (Python reads them through
 * _C.SHM_DIR, _C.RING_PREFIX and _C.shm_files). */
#define WH_SHMFILE_DIR "/dev/shm"
#define WH_SHMFILE_SEGMENT "wirehead."       /* + NAME: the segment of shm://NAME */
#define WH_SHMFILE_PARAMS "wirehead-params." /* + NAME: its params file (never a segment) */
#define WH_SHMFILE_RELAY "wirehead-relay."   /* + NAME + .lock, .json: the relay filling it */
#define WH_SHMFILE_RING "wirehead-ring."     /* + main pid . token . w<k>...: a batch ring */

/* Creates path, which must not exist (O_CREAT|O_EXCL|O_NOFOLLOW: a planted
 * symlink or file is EEXIST, never opened), mode 0600 whatever the umask,
 * read-write, close-on-exec. size > 0: that many bytes are reserved
 * (posix_fallocate), so a full /dev/shm is this error and not a SIGBUS at
 * the first write; on that failure the file is removed again.
 * Returns the descriptor (the caller's to close), or a negative errno with
 * err set: -EEXIST when anything is at path already (then
 * wh_shmfile_open it, or refuse), -ENOSPC (or -EFBIG past a file size
 * limit) when the size cannot be reserved (err->code WH_E_NOSPACE),
 * another for any other failure. */
int wh_shmfile_create(const char *path, uint64_t size, wh_err_t *err);

/* A new file for path that no one can open yet: unnamed (O_TMPFILE) in
 * path's folder, mode 0600 whatever the umask, read-write, close-on-exec,
 * for a creator that makes it ready before wh_shmfile_link names it path.
 * Returns the descriptor, or a negative errno with err set; -EOPNOTSUPP
 * (err not set) where the file system makes no unnamed files: then use
 * wh_shmfile_create. */
int wh_shmfile_create_unnamed(const char *path, wh_err_t *err);

/* Names the unnamed file fd path (linkat): 0, or a negative errno with err
 * set as wh_shmfile_create sets it: -EEXIST when anything is at path
 * already (never replaced, never followed); -EOPNOTSUPP (err not set)
 * where it cannot be named (no /proc): then use wh_shmfile_create. */
int wh_shmfile_link(int fd, const char *path, wh_err_t *err);

/* Opens the existing file at path read-write, close-on-exec, without
 * following a symlink and without blocking on a FIFO, then checks it
 * before anything reads or writes it: a regular file, owned by this
 * process's effective uid, mode 0600, holding at least min_size bytes.
 * Returns the descriptor (the caller's to close), or a negative errno with
 * err set: -ENOENT when nothing is at path (err->code WH_E_NOTFOUND);
 * -ELOOP (a symlink), -EPERM (another owner, another mode, not a regular
 * file) or -EFBIG (too short) when refused (err->code WH_E_INVALID); the
 * open's errno otherwise. */
int wh_shmfile_open(const char *path, uint64_t min_size, wh_err_t *err);

/* The checks of wh_shmfile_open on an open descriptor, for use again
 * before a map or a copy (a file can be truncated or re-moded under us).
 * *size (may be NULL) gets the file's size. */
bool wh_shmfile_check(int fd, const char *path, uint64_t min_size, uint64_t *size, wh_err_t *err);

/* Reserves size bytes of the open file fd (posix_fallocate); false with
 * err naming path, the size and the free space in /dev/shm (WH_E_NOSPACE
 * when there is no room, or a file size limit forbids it). Does not remove the file. */
bool wh_shmfile_reserve(int fd, const char *path, uint64_t size, wh_err_t *err);

#endif
