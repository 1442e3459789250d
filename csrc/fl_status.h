/* fl_status.h: status codes of every fallible C function (0 = success, negative = error).
 * Mirrored by fastload/_status.py; tests/test_status.py checks both agree. */
#ifndef FASTLOAD_FL_STATUS_H
#define FASTLOAD_FL_STATUS_H

typedef enum fl_status {
    FL_OK = 0,
    FL_ETIMEOUT = -1,  /* a bounded wait expired: the caller checks liveness and retries */
    FL_ESTOPPED = -2,  /* the stop flag is set in the segment header */
    FL_ELAYOUT = -3,   /* bad magic, layout version or sizes on attach */
    FL_EINVAL = -4,    /* an argument is out of range (slot index, worker id, ...) */
    FL_ESTATE = -5,    /* a slot is not in the state the operation requires */
    FL_ERANGE = -6,    /* a copy would write or read outside its buffer */
    FL_ENOSPACE = -7,  /* the region is too small for the requested ring */
} fl_status;

#define FL_STATUS_MIN (-7)

/* A stable, static message for a status code (never NULL). */
const char *fl_strerror(int rc);

#endif /* FASTLOAD_FL_STATUS_H */
