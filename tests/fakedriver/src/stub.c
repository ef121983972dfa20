/* Body of every stub driver library: one symbol, so the linker makes a valid shared object whose
 * only interesting parts are its name, SONAME, DT_NEEDED entries and notes (what container tools
 * look at). Built with -DFAKE_ABI_NOTE it also carries the GNU ABI note libnvidia-tls has
 * ("GNU", OS 0 = Linux, kernel 2.3.99). Test double only. */
void nvc_fake_driver_stub(void) {}

#ifdef FAKE_ABI_NOTE
__asm__(".section .note.ABI-tag,\"a\",@note\n"
        ".balign 4\n"
        ".long 4, 16, 1\n" /* namesz, descsz, NT_GNU_ABI_TAG */
        ".asciz \"GNU\"\n"
        ".long 0, 2, 3, 99\n" /* ELF_NOTE_OS_LINUX, 2.3.99 */
        ".previous\n");
#endif
