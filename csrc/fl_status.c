#include "fl_status.h"

const char *fl_strerror(int rc) {
    switch (rc) {
    case FL_OK: return "success";
    case FL_ETIMEOUT: return "timed out";
    case FL_ESTOPPED: return "the ring was stopped";
    case FL_ELAYOUT: return "shared region layout mismatch (magic, version or size)";
    case FL_EINVAL: return "invalid argument";
    case FL_ESTATE: return "slot is not in the required state";
    case FL_ERANGE: return "copy out of bounds";
    case FL_ENOSPACE: return "region too small";
    default: return "unknown fastload status";
    }
}
