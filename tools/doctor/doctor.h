/* `verbrpc doctor`: checks a host's RDMA set-up for verbrpc (devices, ports,
 * GIDs, memlock, and with --peer the route rdma_cm would take) and says what
 * is wrong with the command that fixes it. A subcommand of the `verbrpc`
 * tool; verbrpc-doctor is its standalone form. */
#ifndef VRPC_TOOLS_DOCTOR_H
#define VRPC_TOOLS_DOCTOR_H

/* argv[0] is the command's name; the options follow (see --help). Prints
 * the report on stdout, usage errors on stderr. Returns the exit code: 0 all
 * fine, 1 problems found, 2 usage error. No global state: may be called
 * more than once. */
int vrpc_doctor_main(int argc, char **argv);

#endif
