//! [`counter_enum!`]: an enum whose variants index an array of counters.

/// Declares an enum whose variants index an array of counters: `#[repr(u8)]`, the
/// variants numbered 0, 1, … in the order written, with `COUNT`, `ALL` (counter
/// order), `name()` (the counter's name in the status: the variant's own name, or the
/// string after `=>`) and `index()`.
macro_rules! counter_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident $(=> $label:literal)?,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        $vis enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            pub const COUNT: usize = [$($name::$variant),+].len();
            /// Every variant, in counter order.
            pub const ALL: [$name; $name::COUNT] = [$($name::$variant),+];
            /// The counter's name.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => counter_enum!(@label $variant $($label)?),)+
                }
            }
            /// The counter's index: the position in `ALL`.
            pub fn index(self) -> usize {
                self as usize
            }
        }
    };
    (@label $variant:ident $label:literal) => { $label };
    (@label $variant:ident) => { stringify!($variant) };
}

pub(crate) use counter_enum;
