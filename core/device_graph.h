/* CUDA graphs of the device backend's stream, declared in core beside core/device.h for the layers
 * above (the trainer) and defined by kernels/cuda/graph.cu in a build with DG_HAVE_CUDA, where
 * they are called only under that macro.
 *
 * begin: the stream's work from here on is captured, not run, until end, which returns the graph
 * (NULL with dg_error naming what broke the capture: a read of the device, a free of memory made
 * before the capture, ...); launch replays it on the stream; free waits for the stream and
 * releases it.  What may run inside a capture: kernels/cuda/graph.cu. */
#ifndef DG_CORE_DEVICE_GRAPH_H
#define DG_CORE_DEVICE_GRAPH_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_cuda_graph dg_cuda_graph;
int dg_cuda_graph_begin(void);
dg_cuda_graph *dg_cuda_graph_end(void);
int dg_cuda_graph_launch(dg_cuda_graph *g);
void dg_cuda_graph_free(dg_cuda_graph *g);

#ifdef __cplusplus
}
#endif

#endif
