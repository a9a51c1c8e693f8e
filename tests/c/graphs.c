/*
 * CUDA graphs and pitched copies through the CUDA runtime (NVIDIA's
 * libcudart.so), built with plain gcc; runs on a real GPU or through
 * fairvgpu's libcuda.so.1 stand-in.
 *
 * usage: graphs KERNELS.ptx   (worker/kernels/fairvgpu.ptx)
 * Checks: a graph built node by node (memset, copies, a kernel, a host
 * node) launched three times on new inputs; a kernel node's parameters
 * changed in the executable; a clone; a graph of device work only
 * (memset, kernel, device copy, event record) launched three times, its
 * kernel node changed between; stream capture across two streams
 * joined by events (fork and join), with a host function, launched twice;
 * a user object whose references a captured graph and its executable
 * hold (as cuda-core's GraphBuilder.complete makes one), its destroy
 * callback run once, after the last of them is gone;
 * a synchronize inside a capture refused and the capture spoiled; 2D
 * copies with different pitches both ways, a 2D memset and a 3D copy.
 * Exit 0 only if all is right; the last line says so.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s -> %d (%s)\n", __FILE__, __LINE__, #call, (int)e_, \
    cudaGetErrorString(e_)); exit(1); } } while (0)
#define EXPECT(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: expected %s\n", \
    __FILE__, __LINE__, #cond); exit(1); } } while (0)

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(n + 1);
    if (fread(b, 1, n, f) != (size_t)n) { perror(path); exit(2); }
    b[n] = 0;
    fclose(f);
    return b;
}

static struct cudaPitchedPtr pitched(void *p, size_t pitch, size_t xsize, size_t ysize) {
    struct cudaPitchedPtr r = {p, pitch, xsize, ysize};
    return r;
}
static struct cudaExtent extent(size_t w, size_t h, size_t d) {
    struct cudaExtent r = {w, h, d};
    return r;
}
static struct cudaPos pos(size_t x, size_t y, size_t z) {
    struct cudaPos r = {x, y, z};
    return r;
}

static int host_runs;
static void CUDART_CB count(void *data) { host_runs += (int)(long)data; }

static int user_objects_destroyed;
static void CUDART_CB destroyed(void *data) {
    __atomic_fetch_add((int *)data, 1, __ATOMIC_SEQ_CST);
}

static void check_sum(const float *c, const float *a, const float *b, unsigned n, float k) {
    for (unsigned i = 0; i < n; i++)
        if (c[i] != a[i] + b[i] + k) {
            fprintf(stderr, "c[%u] = %f, want %f\n", i, c[i], a[i] + b[i] + k);
            exit(1);
        }
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s KERNELS.ptx\n", argv[0]); return 2; }
    char *ptx = read_file(argv[1]);
    cudaLibrary_t lib;
    cudaKernel_t vector_add;
    CK(cudaLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0));
    CK(cudaLibraryGetKernel(&vector_add, lib, "vector_add"));

    const unsigned N = 1 << 16;
    size_t bytes = N * sizeof(float);
    float *ha = malloc(bytes), *hb = malloc(bytes), *hc = malloc(bytes);
    float *a, *b, *c;
    CK(cudaMalloc((void **)&a, bytes));
    CK(cudaMalloc((void **)&b, bytes));
    CK(cudaMalloc((void **)&c, bytes));
    for (unsigned i = 0; i < N; i++) hb[i] = 2.0f * (float)i;
    CK(cudaMemcpy(b, hb, bytes, cudaMemcpyHostToDevice));

    /* A graph node by node: c = 0; a <- ha; c = a + b; count; hc <- c. */
    cudaGraph_t g;
    CK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t zero, up, add, host, down;
    struct cudaMemsetParams ms = {0};
    ms.dst = c; ms.value = 0; ms.elementSize = 4; ms.width = N; ms.height = 1;
    CK(cudaGraphAddMemsetNode(&zero, g, NULL, 0, &ms));
    struct cudaMemcpy3DParms cp = {0};
    cp.srcPtr = pitched(ha, bytes, N, 1);
    cp.dstPtr = pitched(a, bytes, N, 1);
    cp.extent = extent(bytes, 1, 1);
    cp.kind = cudaMemcpyHostToDevice;
    CK(cudaGraphAddMemcpyNode(&up, g, NULL, 0, &cp));
    void *args[] = {&a, &b, &c, (void *)&N};
    struct cudaKernelNodeParams kp = {0};
    kp.func = (void *)vector_add;
    kp.gridDim = (dim3){(N + 255) / 256, 1, 1};
    kp.blockDim = (dim3){256, 1, 1};
    kp.kernelParams = args;
    cudaGraphNode_t before_add[] = {zero, up};
    CK(cudaGraphAddKernelNode(&add, g, before_add, 2, &kp));
    struct cudaHostNodeParams hp = {count, (void *)1};
    CK(cudaGraphAddHostNode(&host, g, &add, 1, &hp));
    cp.srcPtr = pitched(c, bytes, N, 1);
    cp.dstPtr = pitched(hc, bytes, N, 1);
    cp.kind = cudaMemcpyDeviceToHost;
    CK(cudaGraphAddMemcpyNode(&down, g, &add, 1, &cp));
    size_t nodes = 0, roots = 0;
    CK(cudaGraphGetNodes(g, NULL, &nodes));
    CK(cudaGraphGetRootNodes(g, NULL, &roots));
    EXPECT(nodes == 5 && roots == 2);
    enum cudaGraphNodeType ty;
    CK(cudaGraphNodeGetType(add, &ty));
    EXPECT(ty == cudaGraphNodeTypeKernel);

    cudaGraphExec_t x;
    CK(cudaGraphInstantiate(&x, g, 0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int round = 0; round < 3; round++) {
        for (unsigned i = 0; i < N; i++) ha[i] = (float)(i + round);
        CK(cudaGraphLaunch(x, s));
        CK(cudaStreamSynchronize(s));
        check_sum(hc, ha, hb, N, 0);
    }
    EXPECT(host_runs == 3);
    printf("graph: 5 nodes built, 3 launches correct\n");

    /* The executable's kernel node reads c as its own input: c = c + b. */
    void *args2[] = {&c, &b, &c, (void *)&N};
    kp.kernelParams = args2;
    CK(cudaGraphExecKernelNodeSetParams(x, add, &kp));
    CK(cudaGraphLaunch(x, s));
    CK(cudaStreamSynchronize(s));
    for (unsigned i = 0; i < N; i++) EXPECT(hc[i] == hb[i]); /* c was zeroed first */
    cudaGraph_t g2;
    CK(cudaGraphClone(&g2, g));
    CK(cudaGraphGetNodes(g2, NULL, &nodes));
    EXPECT(nodes == 5);
    CK(cudaGraphDestroy(g2));
    CK(cudaGraphExecDestroy(x));
    CK(cudaGraphDestroy(g));
    printf("graph: kernel node parameters updated, clone has 5 nodes\n");

    /* A graph of device work only, which the host builds as one CUDA graph:
       d = 0; c = a + b; d <- c (a device copy); recorded event. Launched
       twice, then its kernel node changed to c = c + b (built again). */
    {
        float *d;
        CK(cudaMalloc((void **)&d, bytes));
        for (unsigned i = 0; i < N; i++) ha[i] = (float)(5 * i);
        CK(cudaMemcpy(a, ha, bytes, cudaMemcpyHostToDevice));
        cudaEvent_t done;
        CK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
        cudaGraph_t dg;
        CK(cudaGraphCreate(&dg, 0));
        cudaGraphNode_t dz, dk, dc, de;
        struct cudaMemsetParams dms = {0};
        dms.dst = d; dms.value = 0; dms.elementSize = 4; dms.width = N; dms.height = 1;
        CK(cudaGraphAddMemsetNode(&dz, dg, NULL, 0, &dms));
        void *dargs[] = {&a, &b, &c, (void *)&N};
        kp.kernelParams = dargs;
        CK(cudaGraphAddKernelNode(&dk, dg, &dz, 1, &kp));
        struct cudaMemcpy3DParms dcp = {0};
        dcp.srcPtr = pitched(c, bytes, N, 1);
        dcp.dstPtr = pitched(d, bytes, N, 1);
        dcp.extent = extent(bytes, 1, 1);
        dcp.kind = cudaMemcpyDeviceToDevice;
        CK(cudaGraphAddMemcpyNode(&dc, dg, &dk, 1, &dcp));
        CK(cudaGraphAddEventRecordNode(&de, dg, &dc, 1, done));
        cudaGraphExec_t dx;
        CK(cudaGraphInstantiate(&dx, dg, 0));
        for (int round = 0; round < 2; round++) {
            CK(cudaMemset(d, 0xff, bytes));
            CK(cudaGraphLaunch(dx, s));
            CK(cudaEventSynchronize(done));
            CK(cudaMemcpy(hc, d, bytes, cudaMemcpyDeviceToHost));
            check_sum(hc, ha, hb, N, 0);
        }
        /* c = c + b, where c = a + b from the last launch: d = a + 2b. */
        void *dargs2[] = {&c, &b, &c, (void *)&N};
        kp.kernelParams = dargs2;
        CK(cudaGraphExecKernelNodeSetParams(dx, dk, &kp));
        CK(cudaGraphLaunch(dx, s));
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(hc, d, bytes, cudaMemcpyDeviceToHost));
        for (unsigned i = 0; i < N; i++) EXPECT(hc[i] == ha[i] + 2.0f * hb[i]);
        CK(cudaGraphExecDestroy(dx));
        CK(cudaGraphDestroy(dg));
        CK(cudaEventDestroy(done));
        CK(cudaFree(d));
        printf("graph: device-only graph, 3 launches correct, a kernel node changed\n");
    }

    /* Capture across two streams: s uploads, t adds (after s's event),
       s counts and downloads after t's event. */
    cudaStream_t t;
    CK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    cudaEvent_t forked, joined;
    CK(cudaEventCreateWithFlags(&forked, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming));
    host_runs = 0;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    enum cudaStreamCaptureStatus st;
    CK(cudaStreamIsCapturing(s, &st));
    EXPECT(st == cudaStreamCaptureStatusActive);
    CK(cudaMemcpyAsync(a, ha, bytes, cudaMemcpyHostToDevice, s));
    CK(cudaEventRecord(forked, s));
    CK(cudaStreamWaitEvent(t, forked, 0));
    CK(cudaStreamIsCapturing(t, &st));
    EXPECT(st == cudaStreamCaptureStatusActive);
    CK(cudaLaunchKernel((const void *)vector_add, kp.gridDim, kp.blockDim, args, 0, t));
    CK(cudaEventRecord(joined, t));
    CK(cudaStreamWaitEvent(s, joined, 0));
    CK(cudaLaunchHostFunc(s, count, (void *)10));
    CK(cudaMemcpyAsync(hc, c, bytes, cudaMemcpyDeviceToHost, s));
    cudaGraph_t cg;
    CK(cudaStreamEndCapture(s, &cg));
    CK(cudaStreamIsCapturing(t, &st));
    EXPECT(st == cudaStreamCaptureStatusNone);
    EXPECT(host_runs == 0); /* nothing ran while capturing */
    CK(cudaGraphGetNodes(cg, NULL, &nodes));
    EXPECT(nodes == 4);
    CK(cudaGraphInstantiate(&x, cg, 0));
    for (int round = 0; round < 2; round++) {
        for (unsigned i = 0; i < N; i++) ha[i] = (float)(3 * i + round);
        memset(hc, 0, bytes);
        CK(cudaGraphLaunch(x, s));
        CK(cudaStreamSynchronize(s));
        check_sum(hc, ha, hb, N, 0);
    }
    EXPECT(host_runs == 20);
    CK(cudaGraphExecDestroy(x));
    CK(cudaGraphDestroy(cg));
    printf("capture: two streams forked and joined, 4 nodes, 2 launches correct\n");

    /* Memory nodes: a graph allocates its own buffer, fills it, adds and
       frees it; the buffer's address stays from one launch to the next. */
    {
        size_t free0 = 0, free1 = 0, total = 0;
        CK(cudaMemGetInfo(&free0, &total));
        cudaGraph_t mg;
        CK(cudaGraphCreate(&mg, 0));
        struct cudaMemAllocNodeParams ap;
        memset(&ap, 0, sizeof ap);
        ap.poolProps.allocType = cudaMemAllocationTypePinned;
        ap.poolProps.location.type = cudaMemLocationTypeDevice;
        ap.poolProps.location.id = 0;
        ap.bytesize = bytes;
        cudaGraphNode_t an, in, addn, out, fn;
        CK(cudaGraphAddMemAllocNode(&an, mg, NULL, 0, &ap));
        float *tmp = (float *)ap.dptr;
        EXPECT(tmp != NULL);
        CK(cudaGraphAddMemcpyNode1D(&in, mg, &an, 1, tmp, ha, bytes, cudaMemcpyHostToDevice));
        void *margs[] = {&tmp, &b, &c, (void *)&N};
        struct cudaKernelNodeParams mk = kp;
        mk.kernelParams = margs;
        CK(cudaGraphAddKernelNode(&addn, mg, &in, 1, &mk));
        CK(cudaGraphAddMemcpyNode1D(&out, mg, &addn, 1, hc, c, bytes, cudaMemcpyDeviceToHost));
        CK(cudaGraphAddMemFreeNode(&fn, mg, &out, 1, tmp));
        CK(cudaGraphNodeGetType(an, &ty));
        EXPECT(ty == cudaGraphNodeTypeMemAlloc);
        struct cudaMemAllocNodeParams got;
        CK(cudaGraphMemAllocNodeGetParams(an, &got));
        EXPECT(got.dptr == tmp && got.bytesize == bytes);
        void *freed = NULL;
        CK(cudaGraphMemFreeNodeGetParams(fn, &freed));
        EXPECT(freed == tmp);
        /* No child graph with memory nodes, and no removing them. */
        cudaGraph_t outer;
        CK(cudaGraphCreate(&outer, 0));
        cudaGraphNode_t child;
        EXPECT(cudaGraphAddChildGraphNode(&child, outer, NULL, 0, mg) != cudaSuccess);
        EXPECT(cudaGraphDestroyNode(an) != cudaSuccess);
        (void)cudaGetLastError();
        CK(cudaGraphDestroy(outer));
        cudaGraphExec_t mx;
        CK(cudaGraphInstantiate(&mx, mg, 0));
        CK(cudaGraphDestroy(mg)); /* the executable keeps the allocation */
        unsigned long long used = 0;
        CK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &used));
        EXPECT(used == bytes);
        CK(cudaMemGetInfo(&free1, &total));
        EXPECT(free1 + bytes <= free0); /* the vGPU counts it */
        for (int round = 0; round < 2; round++) {
            for (unsigned i = 0; i < N; i++) ha[i] = (float)(5 * i + round);
            memset(hc, 0, bytes);
            CK(cudaGraphLaunch(mx, s));
            CK(cudaStreamSynchronize(s));
            check_sum(hc, ha, hb, N, 0);
        }
        CK(cudaGraphExecDestroy(mx));
        CK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &used));
        EXPECT(used == 0);
        CK(cudaMemGetInfo(&free1, &total));
        EXPECT(free1 == free0); /* given back to the vGPU */
        CK(cudaDeviceGraphMemTrim(0));
        printf("memory nodes: the graph's own buffer, 2 launches correct, given back with its executable\n");
    }

    /* The same captured: cudaMallocAsync and cudaFreeAsync in a capture. */
    {
        float *tmp = NULL;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        CK(cudaMallocAsync((void **)&tmp, bytes, s));
        EXPECT(tmp != NULL);
        CK(cudaMemcpyAsync(tmp, ha, bytes, cudaMemcpyHostToDevice, s));
        void *margs[] = {&tmp, &b, &c, (void *)&N};
        CK(cudaLaunchKernel((const void *)vector_add, kp.gridDim, kp.blockDim, margs, 0, s));
        CK(cudaMemcpyAsync(hc, c, bytes, cudaMemcpyDeviceToHost, s));
        CK(cudaFreeAsync(tmp, s));
        cudaGraph_t mg;
        CK(cudaStreamEndCapture(s, &mg));
        CK(cudaGraphGetNodes(mg, NULL, &nodes));
        EXPECT(nodes == 5);
        cudaGraphExec_t mx;
        CK(cudaGraphInstantiate(&mx, mg, 0));
        for (int round = 0; round < 2; round++) {
            for (unsigned i = 0; i < N; i++) ha[i] = (float)(7 * i + round);
            memset(hc, 0, bytes);
            CK(cudaGraphLaunch(mx, s));
            CK(cudaStreamSynchronize(s));
            check_sum(hc, ha, hb, N, 0);
        }
        CK(cudaGraphExecDestroy(mx));
        CK(cudaGraphDestroy(mg));
        unsigned long long used = 1;
        CK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &used));
        EXPECT(used == 0);
        printf("memory nodes: captured cudaMallocAsync and cudaFreeAsync, 2 launches correct\n");
    }

    /* A user object held by a captured graph and its executable, as
       cuda-core's GraphBuilder.complete does: created with one reference,
       moved to the graph, the executable takes its own, the graph's is
       released; the callback runs once both graphs are gone. */
    {
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        CK(cudaMemsetAsync(c, 0x3c, bytes, s));
        cudaGraph_t ug;
        CK(cudaStreamEndCapture(s, &ug));
        cudaUserObject_t obj;
        CK(cudaUserObjectCreate(&obj, &user_objects_destroyed, destroyed, 1,
                                cudaUserObjectNoDestructorSync));
        CK(cudaGraphRetainUserObject(ug, obj, 1, cudaGraphUserObjectMove));
        cudaGraphInstantiateParams ip = {0};
        cudaGraphExec_t ux;
        CK(cudaGraphInstantiateWithParams(&ux, ug, &ip));
        EXPECT(ip.result_out == cudaGraphInstantiateSuccess);
        CK(cudaGraphReleaseUserObject(ug, obj, 1));
        memset(hc, 0, bytes);
        CK(cudaGraphLaunch(ux, s));
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(hc, c, bytes, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < bytes; i++) EXPECT(((unsigned char *)hc)[i] == 0x3c);
        EXPECT(__atomic_load_n(&user_objects_destroyed, __ATOMIC_SEQ_CST) == 0);
        CK(cudaGraphExecDestroy(ux));
        CK(cudaGraphDestroy(ug));
        struct timespec ms = {0, 1000000};
        for (int i = 0; i < 1000 && __atomic_load_n(&user_objects_destroyed, __ATOMIC_SEQ_CST) == 0; i++)
            nanosleep(&ms, NULL);
        ms.tv_nsec = 20000000;
        nanosleep(&ms, NULL); /* a second call would come late */
        EXPECT(__atomic_load_n(&user_objects_destroyed, __ATOMIC_SEQ_CST) == 1);
        printf("user objects: released with the last graph\n");
    }

    /* A synchronize inside a capture is refused and spoils it. */
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    CK(cudaMemsetAsync(c, 0, bytes, s));
    EXPECT(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaStreamEndCapture(s, &cg) == cudaErrorStreamCaptureInvalidated);
    (void)cudaGetLastError();
    printf("capture: a synchronize inside it is refused\n");

    /* Pitched memory: 2D copies both ways with other pitches, a 2D memset,
       a 3D copy of a box inside it. */
    const size_t W = 100, H = 37; /* bytes, rows */
    unsigned char *d2;
    size_t pitch;
    CK(cudaMallocPitch((void **)&d2, &pitch, W, H));
    EXPECT(pitch >= W);
    unsigned char *h2 = malloc(130 * H), *back = malloc(110 * H);
    for (size_t i = 0; i < 130 * H; i++) h2[i] = (unsigned char)(i * 7 + 3);
    memset(back, 0xee, 110 * H);
    CK(cudaMemcpy2D(d2, pitch, h2, 130, W, H, cudaMemcpyHostToDevice));
    CK(cudaMemcpy2D(back, 110, d2, pitch, W, H, cudaMemcpyDeviceToHost));
    for (size_t y = 0; y < H; y++)
        for (size_t x2 = 0; x2 < 110; x2++)
            EXPECT(back[y * 110 + x2] == (x2 < W ? h2[y * 130 + x2] : 0xee));
    CK(cudaMemset2DAsync(d2 + pitch, pitch, 0x5a, 10, 3, s));
    CK(cudaMemcpy2DAsync(back, 110, d2, pitch, W, H, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    for (size_t y = 0; y < H; y++)
        for (size_t x2 = 0; x2 < W; x2++)
            EXPECT(back[y * 110 + x2] ==
                   ((y >= 1 && y < 4 && x2 < 10) ? 0x5a : h2[y * 130 + x2]));
    /* 3D: a 4 x 3 x 2 box from the pitched rows (read as slices of 4 rows). */
    unsigned char box[2][3][4];
    struct cudaMemcpy3DParms p3 = {0};
    p3.srcPtr = pitched(d2, pitch, W, 4);
    p3.srcPos = pos(20, 1, 0);
    p3.dstPtr = pitched(box, 4, 4, 3);
    p3.extent = extent(4, 3, 2);
    p3.kind = cudaMemcpyDeviceToHost;
    CK(cudaMemcpy3D(&p3));
    for (int z = 0; z < 2; z++)
        for (int y = 0; y < 3; y++)
            for (int x3 = 0; x3 < 4; x3++)
                EXPECT(box[z][y][x3] == h2[(z * 4 + y + 1) * 130 + 20 + x3]);
    CK(cudaFree(d2));
    printf("pitched: 2D copies both ways, 2D memset and 3D copy correct\n");

    CK(cudaStreamDestroy(s));
    CK(cudaStreamDestroy(t));
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(c));
    CK(cudaLibraryUnload(lib));
    printf("graphs: all checks passed\n");
    return 0;
}
