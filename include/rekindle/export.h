/*
 * What librekindle exports. The library is built with -fvisibility=hidden: a function or
 * variable is part of the installed API only when its declaration in include/rekindle/
 * carries RK_API. Nothing else leaves the .so.
 */
#ifndef REKINDLE_EXPORT_H
#define REKINDLE_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define RK_API __attribute__((visibility("default")))
#else
#define RK_API
#endif

#endif
