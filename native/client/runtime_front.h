/* nvc-py-runtime's calls that only pass through, run by the front without Python (runtime_front.c). */
#ifndef NVC_CLIENT_RUNTIME_FRONT_H
#define NVC_CLIENT_RUNTIME_FRONT_H

/* Executes the runtime nvc-py-runtime would execute for argv (argc words, argv[0] the front's name) where the
 * call needs nothing of nvc-py's and the runtime cache names it; returns where the Python program must run. */
void runtime_pass_through(int argc, char **argv);

#endif
