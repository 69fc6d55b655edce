/* Fault-injection points for tests. Below every other store file: the
 * sample encoder and both backends call in here, nothing here calls up.
 * Compiled in only with WH_FAULTS (the project's own test builds: make sets
 * it); a release build (pip install, the wheel) has empty inline stubs and
 * reads no WIREHEAD_FAULT_* variable. */
#ifndef WH_FAULT_H
#define WH_FAULT_H

#ifdef WH_FAULTS
#define WH_FAULTS_BUILT 1

/* WIREHEAD_FAULT_PUT_PAUSE=<seconds>: a put pauses after writing half of
 * its bytes (before commit), printing "wirehead: fault pause in put" to
 * stderr first. */
void wh_fault_put_midway(void);

/* WIREHEAD_FAULT_SEAL_PAUSE=<seconds>: a seal pauses after the swap and
 * before reclaiming old generations, printing "wirehead: fault pause in
 * seal" to stderr first. */
void wh_fault_seal_midway(void);

/* WIREHEAD_FAULT_SEAL_KILL=<n>: a seal SIGKILLs its own process right
 * after its n-th write to the store (n >= 1), printing "wirehead: fault
 * kill at seal step <n>" to stderr first. Steps are numbered per seal call
 * in the order the writes happen; a seal with fewer writes is unaffected. */
void wh_fault_seal_step(int step);

/* WIREHEAD_FAULT_CUT=<site>[:inside]: the first time a process reaches
 * the point named site (once per process), the /dev/shm file mapped at
 * addr is truncated to 0 bytes (inside: to one byte past addr), printing
 * "wirehead: fault cut at <site>: <path> to <n> bytes" to stderr first.
 * The points sit between a copy's check and the copy out of a shared
 * mapping, so a test cuts the file there and nowhere else. */
void wh_fault_cut(const char *site, const void *addr);
/* WIREHEAD_FAULT_SPEC_COMMIT_KILL=1: a spec put SIGKILLs its own process
 * right after its sample is committed at its position (before it counts
 * the commit, marks the claim done or seals), printing "wirehead: fault
 * kill after spec commit" to stderr first. */
void wh_fault_spec_committed(void);

/* WIREHEAD_FAULT_SPEC_KILL=<op>:<n>[:<k>]: the k-th call (default 1) of a
 * spec-mode store operation op (claim, open, put, seal, fail, abandon)
 * SIGKILLs its own process right after its n-th write to the store,
 * printing "wirehead: fault kill at <op> step <n>" to stderr first. Steps
 * are numbered per call in the order the writes happen. */
void wh_fault_spec_step(const char *op, int step);

#else
#define WH_FAULTS_BUILT 0
static inline void wh_fault_put_midway(void) {}
static inline void wh_fault_seal_midway(void) {}
static inline void wh_fault_seal_step(int step) { (void)step; }
static inline void wh_fault_cut(const char *site, const void *addr) {
    (void)site;
    (void)addr;
}
static inline void wh_fault_spec_committed(void) {}
static inline void wh_fault_spec_step(const char *op, int step) {
    (void)op;
    (void)step;
}
#endif

#endif
