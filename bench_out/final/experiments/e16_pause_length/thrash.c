#include <stdlib.h>
#include <string.h>
int main(void) {
  size_t n = 256u << 20;
  volatile char* p = malloc(n);
  memset((char*)p, 1, n);
  for (;;) for (size_t i = 0; i < n; i += 64) p[i]++;
}
