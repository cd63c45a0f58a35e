/* MXCSR of the calling thread, for tests/test_fpenv.py (compiled there with
 * the system C compiler): set it as a caller of qkern might, read it back. */
#include <xmmintrin.h>

unsigned int mxcsr_get(void) { return _mm_getcsr(); }
void mxcsr_set(unsigned int value) { _mm_setcsr(value); }
