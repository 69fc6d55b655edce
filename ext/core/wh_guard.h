/* Shared mappings that another process can shrink (docs/design.md, "Shared
 * mappings can shrink"). Any file in /dev/shm may be truncated by a process
 * of the same user; touching a mapped page past the file's new end is
 * SIGBUS. Every MAP_SHARED mapping of such a file is made through
 * wh_guard_mmap: a SIGBUS at an address inside one replaces the pages from
 * the faulting one to the mapping's end with private zero pages and marks
 * the mapping shrunk, so the access (ours, torch's over a view, teardown,
 * exit) completes instead of killing the process. The code that owns the
 * mapping then asks wh_guard_shrunk and reports an error naming the file.
 * A SIGBUS anywhere else goes to the handler that was installed before
 * (torch's, faulthandler's, the default). */
#ifndef WH_GUARD_H
#define WH_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* mmap(NULL, len, prot, flags, fd, off) of a file another process can
 * shrink, registered with the guard (installed if it is not). Returns
 * MAP_FAILED with errno set on failure (also when the registry cannot
 * grow: ENOMEM). Unmap it only with wh_guard_munmap. */
void *wh_guard_mmap(size_t len, int prot, int flags, int fd, off_t off);

/* Unregisters and unmaps what wh_guard_mmap returned; addr NULL is a no-op. */
void wh_guard_munmap(void *addr, size_t len);

/* True when a touch past the file's end hit the registered mapping holding
 * addr: from then on it shows zero pages, not the file. */
bool wh_guard_shrunk(const void *addr);

/* True when the registered mapping holding addr no longer shows its whole
 * file: shrunk (above), or the file is now shorter than the mapping (a cut
 * inside a page zeroes the rest of that page in place, and no touch of it
 * faults). *size (may be NULL) gets the file's size now, -1 if unknown.
 * False for an address in no registered mapping. The check after a copy
 * out of such a mapping: one fstat. */
bool wh_guard_cut(const void *addr, long long *size);

/* Puts the guard's SIGBUS handler back in front when other code installed
 * its own since (torch's DataLoader workers do at start; faulthandler does
 * when enabled or disabled); the displaced handler is chained to. One
 * sigaction call: every entry point that touches a shared mapping calls it. */
void wh_guard_ensure(void);

/* For Python code that installs a SIGBUS handler outside any store call
 * (faulthandler.enable, signal.signal: wirehead_torch/_guard.py wraps
 * them). Before a call that saves the handler in front to chain to
 * (faulthandler's enable and register): the guard steps aside, putting
 * back the one it displaced, so that the new handler chains past the
 * guard, not back into it. After the call: wh_guard_restore, which is
 * wh_guard_ensure once the guard was installed in this process (a no-op
 * before). Between the two, a cut page faults as it would without the
 * guard. */
void wh_guard_step_aside(void);
void wh_guard_restore(void);

#endif
