/* Fault-injection points (see wh_fault.h). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "wh.h"
#include "wh_fault.h"

#ifdef WH_FAULTS

typedef struct {
    const char *env;  /* variable naming the pause in seconds */
    const char *what; /* printed so a test can synchronise on it */
    double secs;      /* < 0: no fault point */
    int pid;          /* process that read env: a forked child reads again */
} wh__fault_t;

static wh__fault_t wh__put = {"WIREHEAD_FAULT_PUT_PAUSE", "put", -1, 0};
static wh__fault_t wh__seal = {"WIREHEAD_FAULT_SEAL_PAUSE", "seal", -1, 0};

static void wh__pause(wh__fault_t *f) {
    /* read once per process: getenv is not safe against a concurrent setenv */
    if (__atomic_load_n(&f->pid, __ATOMIC_ACQUIRE) != (int)getpid()) {
        const char *v = getenv(f->env);
        f->secs = (v && *v) ? atof(v) : -1;
        __atomic_store_n(&f->pid, (int)getpid(), __ATOMIC_RELEASE);
    }
    double secs = f->secs;
    if (secs < 0) return;
    fprintf(stderr, "wirehead: fault pause in %s\n", f->what);
    fflush(stderr);
    if (secs > 0) wh_sleep_ms((unsigned)(secs * 1000.0));
}

void wh_fault_put_midway(void) { wh__pause(&wh__put); }
void wh_fault_seal_midway(void) { wh__pause(&wh__seal); }

/* WIREHEAD_FAULT_SEAL_KILL: read once per process like the pauses. */
static int wh__kill_step = -1;
static int wh__kill_pid = 0;

void wh_fault_seal_step(int step) {
    if (__atomic_load_n(&wh__kill_pid, __ATOMIC_ACQUIRE) != (int)getpid()) {
        const char *v = getenv("WIREHEAD_FAULT_SEAL_KILL");
        wh__kill_step = (v && *v) ? atoi(v) : -1;
        __atomic_store_n(&wh__kill_pid, (int)getpid(), __ATOMIC_RELEASE);
    }
    if (step != wh__kill_step) return;
    fprintf(stderr, "wirehead: fault kill at seal step %d\n", step);
    fflush(stderr);
    kill(getpid(), SIGKILL);
    for (;;) pause(); /* never run past the step, even before the signal lands */
}

#else
typedef int wh__no_faults_t; /* a release build: the points are inline stubs */
#endif
