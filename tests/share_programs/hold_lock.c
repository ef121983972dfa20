/* hold_lock: takes the shared region's lock the way libnvc-share does (an OFD write lock on byte 0
 * of <dir>/region), says so, and waits to be killed. Test program for the no-wedge guarantee. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: hold_lock REGION\n");
        return 2;
    }
    int fd = open(argv[1], O_RDWR);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    if (fd < 0 || fcntl(fd, F_OFD_SETLKW, &fl) == -1) {
        perror(argv[1]);
        return 1;
    }
    printf("locked\n");
    fflush(stdout);
    pause();
    return 0;
}
