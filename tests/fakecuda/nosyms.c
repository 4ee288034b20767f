/* A library named like the CUDA runtime that exports none of its symbols: attaching to it must
 * give a clear error (or an empty list), never a crash. */
int not_a_cuda_function(int x) { return x + 1; }
