/* The driver's helper programs (nvidia-debugdump, nvidia-persistenced, nv-fabricmanager,
 * nvidia-cuda-mps-control, nvidia-cuda-mps-server) as one tiny program: it says which one it is
 * and which driver it belongs to, so a test can run it inside a container and see that the right
 * binary was mounted. Test double only. */
#include <stdio.h>
#include <string.h>

#include "fake_machine.h"

int main(int argc, char **argv)
{
    (void)argc;
    const char *slash = strrchr(argv[0], '/');
    printf("%s %s (fake NVIDIA driver)\n", slash ? slash + 1 : argv[0], FAKE_DRIVER_VERSION);
    return 0;
}
