/* Internal to kernels/cuda (C++ only): the state of the stream's capture into a CUDA graph, kept by
 * runtime.cu and driven by graph.cu.  mark tells the runtime that a capture begins or ends;
 * capturing says whether one is under way (a check that would read the device skips itself then:
 * see graph.cu); take_pins hands over the pinned copies of the host memory uploaded during the
 * capture, which the graph reads at each replay. */
#ifndef DG_KERNELS_CUDA_CAPTURE_H
#define DG_KERNELS_CUDA_CAPTURE_H

#include <vector>

void dg_cuda_capture_mark(bool on);
bool dg_cuda_capturing();
std::vector<void *> dg_cuda_capture_take_pins();

#endif
