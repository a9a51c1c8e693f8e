//! The `export!` macro every family module defines its entry points with.

/// Defines exported driver entry points:
///
/// ```ignore
/// export! {
///     /// What it does.
///     fn cuName_v2 [cuName, cuName_v2_ptds per_thread] (a: T, b: U) {
///         ...
///         Ok(())
///     }
/// }
/// ```
///
/// The body returns `Result<(), CuResult>`; panics are caught. Each name in
/// brackets is exported too, as the same function; a `per_thread` alias
/// (the `_ptds`/`_ptsz` variants) runs it with the per-thread default
/// stream as the default stream ([`state::thread::per_thread`](crate::state::thread::per_thread)). `build.rs` reads
/// these `fn` lines to know which symbols are served, so the name and its
/// aliases stay on the `fn` line.
macro_rules! export {
    ($(
        $(#[$meta:meta])*
        fn $name:ident $([$($alias:tt)*])? ($($params:tt)*) $body:block
    )*) => {$(
        export!(@fn $(#[$meta])* $name ($($params)*) $body);
        export!(@aliases $name ($($params)*) [$($($alias)*)?]);
    )*};
    (@fn $(#[$meta:meta])* $name:ident ($($arg:ident : $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::CuResult {
            let r = $crate::entry(|| -> ::std::result::Result<(), $crate::CuResult> { $body });
            $crate::trace(stringify!($name), r);
            r
        }
    };
    (@aliases $name:ident $params:tt []) => {};
    (@aliases $name:ident $params:tt [$alias:ident per_thread $(, $($rest:tt)*)?]) => {
        export!(@alias $name $alias per_thread $params);
        export!(@aliases $name $params [$($($rest)*)?]);
    };
    (@aliases $name:ident $params:tt [$alias:ident $(, $($rest:tt)*)?]) => {
        export!(@alias $name $alias $params);
        export!(@aliases $name $params [$($($rest)*)?]);
    };
    (@alias $name:ident $alias:ident ($($arg:ident : $ty:ty),* $(,)?)) => {
        #[doc = concat!("`", stringify!($alias), "`: the same as [`", stringify!($name), "`].")]
        #[no_mangle]
        pub unsafe extern "C" fn $alias($($arg: $ty),*) -> $crate::CuResult {
            // SAFETY: the caller keeps the contract of the function it names.
            unsafe { $name($($arg),*) }
        }
    };
    (@alias $name:ident $alias:ident per_thread ($($arg:ident : $ty:ty),* $(,)?)) => {
        #[doc = concat!("`", stringify!($alias), "`: [`", stringify!($name), "`] with the per-thread default stream.")]
        #[no_mangle]
        pub unsafe extern "C" fn $alias($($arg: $ty),*) -> $crate::CuResult {
            // SAFETY: the caller keeps the contract of the function it names.
            $crate::state::thread::per_thread(|| unsafe { $name($($arg),*) })
        }
    };
}
