/* nvc-py-runtime's calls that only pass through, run by the front without Python (runtime_front.c). */
#ifndef NVC_CLIENT_RUNTIME_FRONT_H
#define NVC_CLIENT_RUNTIME_FRONT_H

/* Executes the runtime nvc-py-runtime would execute for argv (argc words, argv[0] the front's name) where the
 * call needs nothing of nvc-py's and the runtime cache names it. Otherwise returns the runtime to execute once
 * a hook server's worker rewrote a create's spec (a create that may ask for a GPU, the cache naming the
 * runtime), or NULL where the Python program must run the call. */
const char *runtime_pass_through(int argc, char **argv);

#endif
