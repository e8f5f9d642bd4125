// After a pause of P ms, how long do three fixed pieces of work take?
// alu: a dependent integer loop (no memory); l2: sweeps over 512 KiB; l3: sweeps over 16 MiB;
// dram: one sweep over 256 MiB. Each is timed alone, right after its own pause.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
static double now_ms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
static void pause_ms(int ms) { struct timespec t = {ms / 1000, (ms % 1000) * 1000000L}; nanosleep(&t, NULL); }
static volatile uint64_t sink;
static double alu(void) { double t = now_ms(); uint64_t x = 1; for (long i = 0; i < 20000000; ++i) x = x * 6364136223846793005ULL + 1442695040888963407ULL; sink = x; return now_ms() - t; }
static double sweep(volatile uint64_t* p, size_t n, int times) { double t = now_ms(); uint64_t s = 0; for (int k = 0; k < times; ++k) for (size_t i = 0; i < n; i += 8) s += p[i]; sink = s; return now_ms() - t; }
int main(int argc, char** argv) {
  int pauses[] = {0, 250, 1000, 2500, 10000};
  size_t l2n = (512u << 10) / 8, l3n = (16u << 20) / 8, dn = (256u << 20) / 8;
  uint64_t* l2 = malloc(l2n * 8); uint64_t* l3 = malloc(l3n * 8); uint64_t* d; posix_memalign((void**)&d, 2u << 20, dn * 8); if (getenv("HUGE")) madvise(d, dn * 8, MADV_HUGEPAGE);
  memset(l2, 1, l2n * 8); memset(l3, 1, l3n * 8); memset(d, 1, dn * 8);
  int reps = argc > 1 ? atoi(argv[1]) : 5;
  printf("pause_ms rep alu_ms l2_ms l3_ms dram_ms\n");
  for (int r = 0; r < reps; ++r)
    for (int k = 0; k < 5; ++k) {
      // warm each, then pause before each timed one
      alu(); pause_ms(pauses[k]); double a = alu();
      sweep(l2, l2n, 40); pause_ms(pauses[k]); double b = sweep(l2, l2n, 40);
      sweep(l3, l3n, 2); pause_ms(pauses[k]); double c = sweep(l3, l3n, 2);
      sweep(d, dn, 1); pause_ms(pauses[k]); double e = sweep(d, dn, 1);
      printf("%d %d %.2f %.2f %.2f %.2f\n", pauses[k], r, a, b, c, e);
      fflush(stdout);
    }
}
