/*
 * Conditional graph nodes through the CUDA runtime (NVIDIA's
 * libcudart.so), built with plain gcc; runs through fairvgpu's libcuda.so.1
 * stand-in on the sim (whose model runs cond_set and cond_countdown).
 *
 * usage: conditional FAIRVGPU.ptx CONDITIONAL.ptx
 *   (worker/kernels/fairvgpu.ptx, worker/kernels/conditional.ptx)
 * Checks: an IF whose body runs only when a kernel set 1, and an IF/ELSE;
 * a WHILE (default value 1) whose body, captured into it with
 * cudaStreamBeginCaptureToGraph, counts its iterations until a kernel sets
 * 0; a SWITCH of three bodies for the values 0..3; a WHILE with an IF
 * nested in its body; a WHILE added to a graph being captured; bad inputs
 * refused with the driver's errors.
 * Exit 0 only if all is right; the last line says so.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static cudaKernel_t count_k, set_k, countdown_k;
/* Device words: [0] flag, [1] counter, [2..] hit counters. */
static unsigned *dev;

static unsigned word(int i) {
    unsigned v;
    CK(cudaMemcpy(&v, dev + i, 4, cudaMemcpyDeviceToHost));
    return v;
}
static void set_word(int i, unsigned v) { CK(cudaMemcpy(dev + i, &v, 4, cudaMemcpyHostToDevice)); }

/* A one-thread kernel node of `k` with `args` in graph `g` after `dep`. */
static cudaGraphNode_t kernel(cudaGraph_t g, cudaGraphNode_t *dep, cudaKernel_t k, void **args) {
    struct cudaGraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = cudaGraphNodeTypeKernel;
    p.kernel.func = (void *)k;
    p.kernel.gridDim = (dim3){1, 1, 1};
    p.kernel.blockDim = (dim3){1, 1, 1};
    p.kernel.kernelParams = args;
    cudaGraphNode_t n;
    CK(cudaGraphAddNode(&n, g, dep, NULL, dep ? 1 : 0, &p));
    return n;
}

/* count(dev + i) in graph g. */
static void counter_node(cudaGraph_t g, int i) {
    static unsigned *ptrs[16];
    ptrs[i] = dev + i;
    void *args[] = {&ptrs[i]};
    kernel(g, NULL, count_k, args);
}

static cudaError_t cond_node(cudaGraphNode_t *n, cudaGraph_t g, cudaGraphNode_t *dep,
                             cudaGraphConditionalHandle h, enum cudaGraphConditionalNodeType t,
                             unsigned size, cudaGraph_t **bodies) {
    struct cudaGraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = h;
    p.conditional.type = t;
    p.conditional.size = size;
    cudaError_t e = cudaGraphAddNode(n, g, dep, NULL, dep ? 1 : 0, &p);
    if (bodies) *bodies = p.conditional.phGraph_out;
    return e;
}

static void launch(cudaGraphExec_t x, cudaStream_t s) {
    CK(cudaGraphLaunch(x, s));
    CK(cudaStreamSynchronize(s));
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s FAIRVGPU.ptx CONDITIONAL.ptx\n", argv[0]); return 2; }
    cudaLibrary_t base, cond;
    CK(cudaLibraryLoadData(&base, read_file(argv[1]), NULL, NULL, 0, NULL, NULL, 0));
    CK(cudaLibraryLoadData(&cond, read_file(argv[2]), NULL, NULL, 0, NULL, NULL, 0));
    CK(cudaLibraryGetKernel(&count_k, base, "atomic_count"));
    CK(cudaLibraryGetKernel(&set_k, cond, "cond_set"));
    CK(cudaLibraryGetKernel(&countdown_k, cond, "cond_countdown"));
    CK(cudaMalloc((void **)&dev, 16 * 4));
    CK(cudaMemset(dev, 0, 16 * 4));
    unsigned *flag = dev, *counter = dev + 1;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    /* IF: set(h, *flag) -> IF(h) [count(2)]; and IF/ELSE [count(3) | count(4)]. */
    for (unsigned size = 1; size <= 2; size++) {
        cudaGraph_t g;
        CK(cudaGraphCreate(&g, 0));
        cudaGraphConditionalHandle h;
        CK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
        void *args[] = {&h, &flag};
        cudaGraphNode_t a = kernel(g, NULL, set_k, args), c;
        cudaGraph_t *bodies;
        CK(cond_node(&c, g, &a, h, cudaGraphCondTypeIf, size, &bodies));
        enum cudaGraphNodeType ty;
        CK(cudaGraphNodeGetType(c, &ty));
        EXPECT(ty == cudaGraphNodeTypeConditional);
        counter_node(bodies[0], size == 1 ? 2 : 3);
        if (size == 2) counter_node(bodies[1], 4);
        cudaGraphExec_t x;
        CK(cudaGraphInstantiate(&x, g, 0));
        set_word(0, 0);
        launch(x, s);
        set_word(0, 1);
        launch(x, s);
        set_word(0, 7);
        launch(x, s);
        CK(cudaGraphExecDestroy(x));
        CK(cudaGraphDestroy(g));
    }
    EXPECT(word(2) == 2 && word(3) == 2 && word(4) == 1);
    printf("if: body ran only when the kernel set non-zero (2 of 3 launches), else ran once\n");

    /* WHILE, default 1: [count(5) -> countdown(h, counter)], captured into its body. */
    {
        cudaGraph_t g;
        CK(cudaGraphCreate(&g, 0));
        cudaGraphConditionalHandle h;
        CK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
        cudaGraphNode_t c;
        cudaGraph_t *bodies;
        CK(cond_node(&c, g, NULL, h, cudaGraphCondTypeWhile, 1, &bodies));
        cudaStream_t cs;
        CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
        CK(cudaStreamBeginCaptureToGraph(cs, bodies[0], NULL, NULL, 0, cudaStreamCaptureModeGlobal));
        unsigned *hits = dev + 5;
        void *cargs[] = {&hits};
        CK(cudaLaunchKernel((void *)count_k, (dim3){1, 1, 1}, (dim3){1, 1, 1}, cargs, 0, cs));
        void *dargs[] = {&h, &counter};
        CK(cudaLaunchKernel((void *)countdown_k, (dim3){1, 1, 1}, (dim3){1, 1, 1}, dargs, 0, cs));
        /* As graphConditionalNodes does: a capture into the program's own
         * graph ends without taking it (a null out-parameter). */
        CK(cudaStreamEndCapture(cs, NULL));
        enum cudaStreamCaptureStatus st;
        CK(cudaStreamIsCapturing(cs, &st));
        EXPECT(st == cudaStreamCaptureStatusNone);
        /* A capture of a graph made for it must hand the graph out. */
        CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
        EXPECT(cudaStreamEndCapture(cs, NULL) == cudaErrorInvalidValue);
        cudaGraph_t made;
        CK(cudaStreamEndCapture(cs, &made));
        CK(cudaGraphDestroy(made));
        size_t n = 0;
        CK(cudaGraphGetNodes(bodies[0], NULL, &n));
        EXPECT(n == 2);
        cudaGraphExec_t x;
        CK(cudaGraphInstantiate(&x, g, 0));
        set_word(1, 10);
        launch(x, s);
        EXPECT(word(5) == 10 && word(1) == 0);
        /* Launched again: the default value runs the body once more. */
        set_word(1, 3);
        launch(x, s);
        EXPECT(word(5) == 13 && word(1) == 0);
        CK(cudaGraphExecDestroy(x));
        CK(cudaGraphDestroy(g));
        CK(cudaStreamDestroy(cs));
    }
    printf("while: 10 then 3 iterations until the kernel set 0\n");

    /* SWITCH: set(h, *flag) -> SWITCH(h) [count(6) | count(7) | count(8)], flag 0..3. */
    {
        cudaGraph_t g;
        CK(cudaGraphCreate(&g, 0));
        cudaGraphConditionalHandle h;
        CK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
        void *args[] = {&h, &flag};
        cudaGraphNode_t a = kernel(g, NULL, set_k, args), c;
        cudaGraph_t *bodies;
        CK(cond_node(&c, g, &a, h, cudaGraphCondTypeSwitch, 3, &bodies));
        for (int i = 0; i < 3; i++) counter_node(bodies[i], 6 + i);
        cudaGraphExec_t x;
        CK(cudaGraphInstantiate(&x, g, 0));
        for (unsigned v = 0; v < 4; v++) {
            set_word(0, v);
            launch(x, s);
            for (unsigned i = 0; i < 3; i++) EXPECT(word(6 + i) == (i < v + 1 ? 1u : 0u));
        }
        CK(cudaGraphExecDestroy(x));
        CK(cudaGraphDestroy(g));
    }
    printf("switch: values 0, 1, 2 ran their body, 3 ran none\n");

    /* Nested: WHILE(h) [set(h2, *flag) -> IF(h2) [count(9)] -> countdown(h, counter)]. */
    {
        cudaGraph_t g;
        CK(cudaGraphCreate(&g, 0));
        cudaGraphConditionalHandle h, h2;
        CK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
        cudaGraphNode_t c, c2;
        cudaGraph_t *loop, *then;
        CK(cond_node(&c, g, NULL, h, cudaGraphCondTypeWhile, 1, &loop));
        cudaGraph_t body = loop[0];
        CK(cudaGraphConditionalHandleCreate(&h2, body, 0, 0));
        void *sargs[] = {&h2, &flag};
        cudaGraphNode_t a = kernel(body, NULL, set_k, sargs);
        CK(cond_node(&c2, body, &a, h2, cudaGraphCondTypeIf, 1, &then));
        counter_node(then[0], 9);
        void *dargs[] = {&h, &counter};
        kernel(body, &c2, countdown_k, dargs);
        cudaGraphExec_t x;
        CK(cudaGraphInstantiate(&x, g, 0));
        set_word(0, 1);
        set_word(1, 4);
        launch(x, s);
        EXPECT(word(9) == 4);
        set_word(0, 0);
        set_word(1, 4);
        launch(x, s);
        EXPECT(word(9) == 4 && word(1) == 0);
        CK(cudaGraphExecDestroy(x));
        CK(cudaGraphDestroy(g));
    }
    printf("nested: an IF inside a WHILE ran 4 times, then none\n");

    /* Captured: set(h, *counter) -> WHILE(h) [countdown-like set] -> count(10). */
    {
        cudaStream_t cs;
        CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
        CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
        enum cudaStreamCaptureStatus st;
        cudaGraph_t g;
        const cudaGraphNode_t *deps;
        size_t nd;
        CK(cudaStreamGetCaptureInfo(cs, &st, NULL, &g, &deps, NULL, &nd));
        EXPECT(st == cudaStreamCaptureStatusActive && nd == 0);
        cudaGraphConditionalHandle h;
        CK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
        void *sargs[] = {&h, &counter};
        CK(cudaLaunchKernel((void *)set_k, (dim3){1, 1, 1}, (dim3){1, 1, 1}, sargs, 0, cs));
        CK(cudaStreamGetCaptureInfo(cs, &st, NULL, &g, &deps, NULL, &nd));
        EXPECT(nd == 1);
        cudaGraphNode_t c;
        cudaGraph_t *bodies;
        CK(cond_node(&c, g, (cudaGraphNode_t *)deps, h, cudaGraphCondTypeWhile, 1, &bodies));
        CK(cudaStreamUpdateCaptureDependencies(cs, &c, NULL, 1, cudaStreamSetCaptureDependencies));
        unsigned *after = dev + 10;
        void *cargs[] = {&after};
        CK(cudaLaunchKernel((void *)count_k, (dim3){1, 1, 1}, (dim3){1, 1, 1}, cargs, 0, cs));
        CK(cudaStreamEndCapture(cs, &g));
        void *dargs[] = {&h, &counter};
        unsigned *loops = dev + 11;
        void *largs[] = {&loops};
        cudaGraphNode_t l = kernel(bodies[0], NULL, count_k, largs);
        kernel(bodies[0], &l, countdown_k, dargs);
        cudaGraphExec_t x;
        CK(cudaGraphInstantiate(&x, g, 0));
        set_word(1, 0);
        launch(x, s);
        EXPECT(word(11) == 0 && word(10) == 1);
        set_word(1, 6);
        launch(x, s);
        EXPECT(word(11) == 6 && word(10) == 2);
        CK(cudaGraphExecDestroy(x));
        CK(cudaGraphDestroy(g));
        CK(cudaStreamDestroy(cs));
    }
    printf("captured: a WHILE added to a capture ran 0 then 6 times, the node after it ran each time\n");

    /* Bad inputs. */
    {
        cudaGraph_t g, other;
        CK(cudaGraphCreate(&g, 0));
        CK(cudaGraphCreate(&other, 0));
        cudaGraphConditionalHandle h, ho;
        EXPECT(cudaGraphConditionalHandleCreate(&h, g, 0, 2) == cudaErrorInvalidValue);
        cudaGetLastError();
        CK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
        CK(cudaGraphConditionalHandleCreate(&ho, other, 0, 0));
        cudaGraphNode_t c;
        /* Another graph's handle, sizes the driver refuses. */
        EXPECT(cond_node(&c, g, NULL, ho, cudaGraphCondTypeIf, 1, NULL) == cudaErrorInvalidValue);
        cudaGetLastError();
        EXPECT(cond_node(&c, g, NULL, h, cudaGraphCondTypeIf, 3, NULL) == cudaErrorInvalidValue);
        cudaGetLastError();
        EXPECT(cond_node(&c, g, NULL, h, cudaGraphCondTypeWhile, 2, NULL) == cudaErrorInvalidValue);
        cudaGetLastError();
        EXPECT(cond_node(&c, g, NULL, h, (enum cudaGraphConditionalNodeType)7, 1, NULL) == cudaErrorInvalidValue);
        cudaGetLastError();
        /* A graph with a conditional cannot be a child graph. */
        cudaGraph_t *bodies;
        CK(cond_node(&c, g, NULL, h, cudaGraphCondTypeIf, 1, &bodies));
        cudaGraph_t parent;
        CK(cudaGraphCreate(&parent, 0));
        cudaGraphNode_t child;
        EXPECT(cudaGraphAddChildGraphNode(&child, parent, NULL, 0, g) == cudaErrorNotSupported);
        cudaGetLastError();
        CK(cudaGraphDestroy(parent));
        CK(cudaGraphDestroy(other));
        CK(cudaGraphDestroy(g));
    }
    printf("errors: bad flags, a foreign handle, bad sizes and types refused\n");
    CK(cudaFree(dev));
    printf("conditional: all checks passed\n");
    return 0;
}
