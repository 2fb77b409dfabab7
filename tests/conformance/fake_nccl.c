/*
 * A stand-in libnccl.so.2 for the nccl backend's loading checks (no GPU
 * needed): it exports every entry point the backend requires, which all fail
 * (ncclInternalError), an ncclGetVersion that returns FAKE_NCCL_VERSION, and
 * five optional ones: ncclCommSplit, ncclCommShrink and ncclCommRevoke (as
 * 2.28.9 has them) and the pair 2.29.2 brought for grows. With
 * FAKE_NCCL_NO_GROUP_END it lacks ncclGroupEnd, a required one.
 *
 * tests/conformance/CMakeLists.txt builds it for a 2.28.9 that exports the
 * 2.29 grow entry points (the backend must not use them: "old") and for a
 * runtime without ncclGroupEnd, and runs ncfsm-info against each.
 */
#ifndef FAKE_NCCL_VERSION
#error "FAKE_NCCL_VERSION (an NCCL_VERSION_CODE) must be defined"
#endif

#define FAIL 3 /* ncclInternalError */

#define STUB(name) \
  int name(void);  \
  int name(void) { return FAIL; }

int ncclGetVersion(int *version);
int ncclGetVersion(int *version) {
  *version = FAKE_NCCL_VERSION;
  return 0;
}

const char *ncclGetLastError(void *comm);
const char *ncclGetLastError(void *comm) {
  (void)comm;
  return "fake libnccl.so.2 (tests/conformance/fake_nccl.c)";
}

const char *ncclGetErrorString(int result);
const char *ncclGetErrorString(int result) {
  (void)result;
  return "fake";
}

STUB(ncclGetUniqueId)
STUB(ncclCommInitRankConfig)
STUB(ncclCommGetAsyncError)
STUB(ncclCommFinalize)
STUB(ncclCommDestroy)
STUB(ncclCommAbort)
STUB(ncclCommUserRank)
STUB(ncclCommCount)
STUB(ncclAllReduce)
STUB(ncclBroadcast)
STUB(ncclReduce)
STUB(ncclAllGather)
STUB(ncclReduceScatter)
STUB(ncclSend)
STUB(ncclRecv)
STUB(ncclGroupStart)
#ifndef FAKE_NCCL_NO_GROUP_END
STUB(ncclGroupEnd)
#endif

/* Optional: what 2.28.9 has, and the 2.29 grow pair it does not. */
STUB(ncclCommSplit)
STUB(ncclCommShrink)
STUB(ncclCommRevoke)
STUB(ncclCommGetUniqueId)
STUB(ncclCommGrow)
