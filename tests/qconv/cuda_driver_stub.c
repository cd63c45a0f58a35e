/* A stand-in for libcuda.so.1 on machines without an NVIDIA driver.
 *
 * cuDNN's engine sub-libraries are linked against libcuda.so.1 and refuse to
 * load without it (CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED), even though
 * building and finalizing graph descriptors never reaches the GPU.  This
 * library exports the driver symbols they link to, and a few that probes
 * call; every one reports CUDA_ERROR_NO_DEVICE (100).  Tests compile it
 * into a temporary directory and put that on LD_LIBRARY_PATH of a child
 * process only.
 */
#define CUDA_ERROR_NO_DEVICE 100

typedef int CUresult;

CUresult cuInit(unsigned flags) {
  (void)flags;
  return CUDA_ERROR_NO_DEVICE;
}
CUresult cuDriverGetVersion(int* v) {
  if (v) *v = 13000;
  return 0;
}
CUresult cuDeviceGetCount(int* n) {
  if (n) *n = 0;
  return CUDA_ERROR_NO_DEVICE;
}
CUresult cuGetErrorString(CUresult e, const char** s) {
  static const char msg[] = "no CUDA device (qkern test stand-in driver)";
  (void)e;
  if (s) *s = msg;
  return 0;
}
CUresult cuGetErrorName(CUresult e, const char** s) {
  static const char msg[] = "CUDA_ERROR_NO_DEVICE";
  (void)e;
  if (s) *s = msg;
  return 0;
}
CUresult cuGetProcAddress(const char* sym, void** p, int v, unsigned long long f) {
  (void)sym;
  (void)v;
  (void)f;
  if (p) *p = 0;
  return CUDA_ERROR_NO_DEVICE;
}
CUresult cuGetProcAddress_v2(const char* sym, void** p, int v, unsigned long long f, void* st) {
  (void)sym;
  (void)v;
  (void)f;
  (void)st;
  if (p) *p = 0;
  return CUDA_ERROR_NO_DEVICE;
}
CUresult cuModuleGetFunction(void) { return CUDA_ERROR_NO_DEVICE; }
CUresult cuModuleLoadData(void) { return CUDA_ERROR_NO_DEVICE; }
CUresult cuModuleUnload(void) { return CUDA_ERROR_NO_DEVICE; }
CUresult cuTensorMapEncodeIm2col(void) { return CUDA_ERROR_NO_DEVICE; }
CUresult cuTensorMapEncodeTiled(void) { return CUDA_ERROR_NO_DEVICE; }
