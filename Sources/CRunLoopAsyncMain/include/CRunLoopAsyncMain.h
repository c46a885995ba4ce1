#pragma once
#include <stdbool.h>

/// Whether the constructor installed the async-main drain hook (false: the runtime has none, or
/// another library had set it first; the reason went to standard error).
bool rlam_hook_installed(void);
