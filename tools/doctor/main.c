/* verbrpc-doctor: the standalone form of `verbrpc doctor`. */
#include "tools/doctor/doctor.h"

int main(int argc, char **argv) { return vrpc_doctor_main(argc, argv); }
