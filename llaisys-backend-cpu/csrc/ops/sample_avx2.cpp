// The vector passes of sample compiled for this file's instruction set.
#include "sample_instances.h"
