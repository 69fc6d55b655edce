/* ext/core/wh_shmfile.c: files in shared memory are made exclusively, and an
 * existing one is used only when it is ours, mode 0600, a regular file of
 * the size expected; whatever is refused is left exactly as it was. Runs in
 * a private directory under /dev/shm (the real file system). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wh_shmfile.h"

static int failures;
static char dir[64];

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);                  \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static const char *at(const char *name) {
    static char buf[4][128];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", dir, name);
    return p;
}

/* A file with known bytes, to show a refusal left it alone. */
static void plant(const char *path, const char *text, mode_t mode) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text) || fchmod(fd, mode)) {
        perror(path);
        exit(2);
    }
    close(fd);
}

static bool holds(const char *path, const char *text) {
    char got[256] = {0};
    int fd = open(path, O_RDONLY | O_NOFOLLOW);
    if (fd < 0) return false;
    ssize_t n = read(fd, got, sizeof got - 1);
    struct stat st;
    bool same = fstat(fd, &st) == 0 && n == (ssize_t)strlen(text) &&
                st.st_size == (off_t)strlen(text) && !strcmp(got, text);
    close(fd);
    return same;
}

static bool said(const wh_err_t *e, const char *path, const char *why) {
    bool ok = strstr(e->message, path) && strstr(e->message, why);
    if (!ok) fprintf(stderr, "  message was: %s\n", e->message);
    return ok;
}

static void test_create(void) {
    wh_err_t e = {0};
    mode_t old = umask(0277); /* the file is 0600 whatever the umask */
    int fd = wh_shmfile_create(at("new"), 8192, &e);
    umask(old);
    CHECK(fd >= 0);
    struct stat st;
    CHECK(fstat(fd, &st) == 0 && (st.st_mode & 07777) == 0600 && st.st_size == 8192 &&
          st.st_blocks * 512 >= 8192); /* reserved, not a hole */
    CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    close(fd);

    /* anything already there is EEXIST and stays as it was */
    CHECK(wh_shmfile_create(at("new"), 16, &e) == -EEXIST && said(&e, at("new"), "exists"));
    CHECK(stat(at("new"), &st) == 0 && st.st_size == 8192);
    plant(at("target"), "precious", 0666);
    CHECK(symlink(at("target"), at("link")) == 0);
    CHECK(wh_shmfile_create(at("link"), 4096, &e) == -EEXIST &&
          said(&e, at("link"), "is a symbolic link: refused"));
    CHECK(holds(at("target"), "precious"));
    CHECK(symlink(at("nowhere"), at("dangling")) == 0);
    CHECK(wh_shmfile_create(at("dangling"), 4096, &e) == -EEXIST);
    CHECK(access(at("nowhere"), F_OK) != 0 && errno == ENOENT); /* not made through the link */

    /* a reservation that fails removes the file it made */
    struct rlimit lim, one;
    getrlimit(RLIMIT_FSIZE, &lim);
    one = lim;
    one.rlim_cur = 4096;
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &one);
    fd = wh_shmfile_create(at("big"), 1 << 20, &e);
    setrlimit(RLIMIT_FSIZE, &lim);
    CHECK(fd == -EFBIG && said(&e, at("big"), "cannot reserve 1048576 bytes in /dev/shm"));
    CHECK(access(at("big"), F_OK) != 0);
    CHECK(wh_shmfile_create(at("nodir/x"), 0, &e) == -ENOENT && e.code == WH_E_SYS);
}

static void test_open(void) {
    wh_err_t e = {0};
    int fd = wh_shmfile_create(at("mine"), 4096, &e);
    CHECK(fd >= 0);
    close(fd);
    fd = wh_shmfile_open(at("mine"), 4096, &e);
    CHECK(fd >= 0 && (fcntl(fd, F_GETFL) & O_NONBLOCK) == 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC));
    uint64_t size = 0;
    CHECK(wh_shmfile_check(fd, at("mine"), 4096, &size, &e) && size == 4096);
    /* truncated under us: the next check says so */
    CHECK(ftruncate(fd, 100) == 0);
    CHECK(!wh_shmfile_check(fd, at("mine"), 4096, NULL, &e) &&
          said(&e, at("mine"), "holds 100 bytes, 4096 expected"));
    close(fd);
    CHECK(wh_shmfile_open(at("mine"), 4096, &e) == -EFBIG && e.code == WH_E_INVALID &&
          said(&e, at("mine"), "truncated"));
    CHECK(wh_shmfile_open(at("absent"), 0, &e) == -ENOENT && e.code == WH_E_NOTFOUND);

    /* refused, named, and not written */
    CHECK(wh_shmfile_open(at("link"), 0, &e) == -ELOOP && e.code == WH_E_INVALID &&
          said(&e, at("link"), "is a symbolic link: refused"));
    CHECK(holds(at("target"), "precious"));
    plant(at("loose"), "shared", 0644);
    CHECK(wh_shmfile_open(at("loose"), 0, &e) == -EPERM &&
          said(&e, at("loose"), "has mode 644, not 0600"));
    CHECK(holds(at("loose"), "shared"));
    CHECK(mkfifo(at("fifo"), 0600) == 0);
    CHECK(wh_shmfile_open(at("fifo"), 0, &e) == -EPERM &&
          said(&e, at("fifo"), "is not a regular file"));
    CHECK(mkdir(at("subdir"), 0700) == 0);
    CHECK(wh_shmfile_open(at("subdir"), 0, &e) == -EPERM);
    if (geteuid() == 0) {
        /* root here: a file of another uid, as another user would plant it */
        plant(at("theirs"), "theirs", 0600);
        CHECK(chown(at("theirs"), 65534, 65534) == 0);
        CHECK(wh_shmfile_open(at("theirs"), 0, &e) == -EPERM &&
              said(&e, at("theirs"), "belongs to uid 65534, not to this user (uid 0)"));
        CHECK(holds(at("theirs"), "theirs"));
    } else {
        printf("test_shmfile: not root, the other-owner case is left to "
               "tests/faults/test_shm_files.py\n");
    }
}

int main(void) {
    snprintf(dir, sizeof dir, "/dev/shm/wh-test-shmfile.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp under /dev/shm");
        return 2;
    }
    test_create();
    test_open();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    if (failures) {
        fprintf(stderr, "test_shmfile: %d failures\n", failures);
        return 1;
    }
    printf("test_shmfile: ok\n");
    return 0;
}
