/* bench/template: the kernel calls of a sandbox start with pivot_root, against a start from a
 * root template (setns into its user and mount namespaces, then unshare), with N idle
 * threads elsewhere on the host (pivot_root's chroot_fs_refs visits every task).
 *
 *   bench/template/run [ROUNDS] [TASKS...]     (default: 300 rounds; 0 10000 20000 tasks)
 *
 * Prints the mean of each kind of start per round, interleaved. Not lockbox's code: the
 * same calls, made small, to show what each costs (docs/benchmarks.md, "Roots copied from a
 * template"). Exit status 1 if a start failed. */
#define _GNU_SOURCE
#include <signal.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <errno.h>
#include <time.h>
#include <pthread.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#define CK(x) do { if ((x) < 0) { fprintf(stderr, "%s: %s (line %d)\n", #x, strerror(errno), __LINE__); _exit(3);} } while (0)
static void wr(const char *p, const char *s) { int fd = open(p, O_WRONLY); CK(fd); CK(write(fd, s, strlen(s))); close(fd); }
static void wrat(int d, const char *p, const char *s) { int fd = openat(d, p, O_WRONLY); CK(fd); CK(write(fd, s, strlen(s))); close(fd); }
static void mapsat(int d, uid_t u, gid_t g) { char b[64]; wrat(d, "setgroups", "deny"); snprintf(b, 64, "0 %d 1", u); wrat(d, "uid_map", b); snprintf(b, 64, "0 %d 1", g); wrat(d, "gid_map", b); }
static void maps(uid_t u, gid_t g) { int d = open("/proc/self", O_PATH|O_DIRECTORY); CK(d); mapsat(d, u, g); close(d); }
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
/* Shared part of a root: stage tmpfs, /usr ro bind, /dev tmpfs with null, mountpoints */
static void build_shared(const char *st) {
  char p[256];
  CK(mount("tmpfs", st, "tmpfs", 0, "mode=0755"));
  CK(chdir(st));
  mkdir("usr", 0755); CK(mount("/usr", "usr", NULL, MS_BIND | MS_REC, NULL)); CK(mount(NULL, "usr", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL));
  symlink("usr/bin", "bin"); symlink("usr/lib", "lib"); symlink("usr/lib64", "lib64");
  mkdir("dev", 0755); CK(mount("tmpfs", "dev", "tmpfs", 0, "mode=0755,size=64k"));
  for (const char **d = (const char *[]){"null", "zero", "urandom", 0}; *d; d++) { snprintf(p, 256, "dev/%s", *d); close(open(p, O_CREAT | O_WRONLY, 0644)); char h[64]; snprintf(h, 64, "/dev/%s", *d); CK(mount(h, p, NULL, MS_BIND, NULL)); }
  mkdir("dev/pts", 0755); mkdir("dev/shm", 0755);
  CK(mount(NULL, "dev", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL));
  mkdir("proc", 0555); mkdir("tmp", 01777); mkdir("etc", 0755);
  CK(mount("/etc", "etc", NULL, MS_BIND, NULL)); CK(mount(NULL, "etc", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL));
}
static void per_sandbox(const char *pre) {
  char p[256];
  snprintf(p, 256, "%sproc", pre); CK(mount("proc", p, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL));
  snprintf(p, 256, "%sproc/sys", pre); CK(mount(p, p, NULL, MS_BIND | MS_REC, NULL)); CK(mount(NULL, p, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL));
  snprintf(p, 256, "%stmp", pre); CK(mount("tmpfs", p, "tmpfs", 0, "mode=1777"));
  snprintf(p, 256, "%sdev/shm", pre); CK(mount("tmpfs", p, "tmpfs", 0, "mode=1777"));
  snprintf(p, 256, "%sdev/pts", pre); CK(mount("devpts", p, "devpts", 0, "newinstance,ptmxmode=0666,mode=620"));
}
static uid_t U; static gid_t G;
static int pivot_one(void) {
  pid_t c = fork();
  if (c == 0) {
    CK(unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS)); maps(U, G);
    pid_t i = fork();
    if (i == 0) {
      CK(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL));
      build_shared("/tmp");  /* stage over /tmp, cwd = stage */
      per_sandbox("");
      CK(syscall(SYS_pivot_root, ".", "."));
      CK(umount2(".", MNT_DETACH)); CK(chdir("/"));
      if (access("/usr/bin/true", X_OK)) _exit(4);
      _exit(0);
    }
    int s; waitpid(i, &s, 0); _exit(WIFEXITED(s) ? WEXITSTATUS(s) : 9);
  }
  int s; waitpid(c, &s, 0); return s;
}
static int tu = -1, tm = -1;
static pid_t holder_parent = -1, holder = -1;
static int template_one(void) {
  pid_t c = fork();
  if (c == 0) {
    int d = open("/proc/self", O_PATH|O_DIRECTORY); CK(d);
    CK(setns(tu, CLONE_NEWUSER)); CK(setns(tm, CLONE_NEWNS));
    CK(unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS)); mapsat(d, 0, 0); close(d);
    pid_t i = fork();
    if (i == 0) {
      per_sandbox("/");
      if (access("/usr/bin/true", X_OK)) _exit(4);
      /* check isolation: /tmp empty, proc shows pid 1 = us */
      _exit(0);
    }
    int s; waitpid(i, &s, 0); _exit(WIFEXITED(s) ? WEXITSTATUS(s) : 9);
  }
  int s; waitpid(c, &s, 0); return s;
}
static void make_template(void) {
  int pp[2]; CK(pipe(pp));
  pid_t c = fork();
  if (c == 0) {
    CK(unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID)); maps(U, G);
    pid_t i = fork();
    if (i == 0) {
      CK(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL));
      build_shared("/tmp");
      CK(mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL));
      CK(syscall(SYS_pivot_root, ".", "."));
      CK(umount2(".", MNT_DETACH)); CK(chdir("/"));
      CK(mount(NULL, "/", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL));
      CK(write(pp[1], "x", 1)); pause(); _exit(0);
    }
    pause(); _exit(0);
  }
  char x; CK(read(pp[0], &x, 1));
  /* the grandchild is the holder: find it via children of c */
  char p[128]; snprintf(p, 128, "/proc/%d/task/%d/children", c, c); FILE *f = fopen(p, "r"); int h; if (fscanf(f, "%d", &h) != 1) exit(5); fclose(f);
  holder_parent = c; holder = h;
  snprintf(p, 128, "/proc/%d/ns/user", h); tu = open(p, O_RDONLY); CK(tu);
  snprintf(p, 128, "/proc/%d/ns/mnt", h); tm = open(p, O_RDONLY); CK(tm);
}
static void *idle(void *a) { (void)a; pause(); return 0; }
int main(int argc, char **argv) {
  int n = atoi(argv[1]), tasks = argc > 2 ? atoi(argv[2]) : 0;
  U = getuid(); G = getgid();
  pid_t idle_pid = tasks ? fork() : -1;
  if (idle_pid == 0) { for (int i = 0; i < tasks; i++) { pthread_t t; pthread_attr_t at; pthread_attr_init(&at); pthread_attr_setstacksize(&at, 65536); if (pthread_create(&t, &at, idle, 0)) { perror("thread"); return 1; } } pause(); } if (tasks) sleep(tasks / 5000 + 1);
  make_template();
  double tp = 0, tt = 0;
  for (int i = 0; i < n; i++) {
    double a = now(); int s1 = pivot_one(); double b = now(); int s2 = template_one(); double c = now();
    if (s1 || s2) { fprintf(stderr, "fail %x %x\n", s1, s2); n = i; tp = tt = 0; break; }
    tp += b - a; tt += c - b;
  }
  if (idle_pid > 0) kill(idle_pid, SIGKILL);
  kill(holder, SIGKILL); kill(holder_parent, SIGKILL);
  while (wait(NULL) > 0) {}
  if (tp == 0) return 1;
  printf("tasks %d: pivot_root start %.3f ms, from a template %.3f ms (%d rounds)\n", tasks, tp / n * 1e3, tt / n * 1e3, n);
  return 0;
}
